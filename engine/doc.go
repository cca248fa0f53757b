// Package engine is imcanary's measuring engine: the population that keeps
// users online through an adapter (package probe's Driver and Session) and
// sends open-loop traffic between them, the ledger that turns what they
// receive into loss, lateness, duplicate, reorder and recovery counts, and
// Reach, whether the target takes logins. Adapters never import it.
package engine
