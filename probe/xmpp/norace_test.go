//go:build !race

package xmpp_test

const raceEnabled = false
