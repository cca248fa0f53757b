//go:build race

package xmpp_test

const raceEnabled = true
