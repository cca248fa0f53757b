package main

import (
	"bytes"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestHealth(t *testing.T) {
	serve := func(status int, body string) string {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.WriteHeader(status)
			fmt.Fprint(w, body)
		}))
		t.Cleanup(srv.Close)
		return srv.URL + "/healthz"
	}
	// A port that was free a moment ago: connecting to it is refused.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refused := "http://" + ln.Addr().String() + "/healthz"
	ln.Close()
	// A server that never answers: the timeout must end the check.
	hang := httptest.NewServer(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		<-r.Context().Done()
	}))
	t.Cleanup(hang.Close)

	ok := serve(http.StatusOK, "ok\n")
	tests := []struct {
		name    string
		args    []string
		want    int
		wantOut string // in stdout or stderr
	}{
		{"200", []string{"--url", ok}, exitOK, ok + ": 200 OK"},
		{"503 with reason", []string{"--url", serve(http.StatusServiceUnavailable, "not ready: 3 of 100 sessions online\nmore\n")},
			exitFail, "503 Service Unavailable: not ready: 3 of 100 sessions online"},
		{"500 without body", []string{"--url", serve(http.StatusInternalServerError, "")}, exitFail, "500 Internal Server Error"},
		{"204 is not 200", []string{"--url", serve(http.StatusNoContent, "")}, exitFail, "204 No Content"},
		{"refused", []string{"--url", refused}, exitFail, "connection refused"},
		{"timeout", []string{"--url", hang.URL, "--timeout", "100ms"}, exitFail, "deadline exceeded"},
		{"bad url", []string{"--url", "::"}, exitFail, "--url"},
		// Docker reserves exit 2, so bad usage is unhealthy too.
		{"bad flag", []string{"--bogus"}, exitFail, "unknown flag: --bogus"},
		{"bad timeout", []string{"--timeout", "0s"}, exitFail, "--timeout"},
		{"argument", []string{"now"}, exitFail, `unexpected argument "now"`},
		{"help", []string{"--help"}, exitOK, "Usage: imcanary health"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			args := append([]string{"health"}, tt.args...)
			got := run(args, &out, &errOut)
			all := out.String() + errOut.String()
			if got != tt.want || !strings.Contains(all, tt.wantOut) {
				t.Errorf("run(%q) = %d, output %q; want %d and output containing %q", args, got, all, tt.want, tt.wantOut)
			}
			// A failure is one line, for Docker's health log.
			if got == exitFail {
				if lines := strings.Count(errOut.String(), "\n"); lines != 1 {
					t.Errorf("run(%q) wrote %d lines to stderr, want 1: %q", args, lines, errOut.String())
				}
			}
		})
	}
}
