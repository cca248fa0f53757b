package main

import (
	"bytes"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
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
	// A daemon with a --web.config.file: TLS with its own certificate,
	// and basic authentication.
	secured := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if u, p, ok := r.BasicAuth(); !ok || u != "prom" || p != "s3cret" {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		fmt.Fprint(w, "ok\n")
	}))
	t.Cleanup(secured.Close)
	passFile := filepath.Join(t.TempDir(), "pass")
	if err := os.WriteFile(passFile, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	wrongFile := filepath.Join(t.TempDir(), "wrong")
	if err := os.WriteFile(wrongFile, []byte("nope"), 0o600); err != nil {
		t.Fatal(err)
	}
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
		{"tls and basic auth", []string{"--url", secured.URL, "--tls.insecure-skip-verify", "--basic-auth.username", "prom", "--basic-auth.password-file", passFile},
			exitOK, "200 OK"},
		{"wrong password", []string{"--url", secured.URL, "--tls.insecure-skip-verify", "--basic-auth.username", "prom", "--basic-auth.password-file", wrongFile},
			exitFail, "401 Unauthorized"},
		{"unverified certificate", []string{"--url", secured.URL, "--basic-auth.username", "prom", "--basic-auth.password-file", passFile},
			exitFail, "certificate"},
		{"user without password", []string{"--url", secured.URL, "--basic-auth.username", "prom"}, exitFail, "--basic-auth.password-file"},
		{"missing password file", []string{"--url", secured.URL, "--basic-auth.username", "prom", "--basic-auth.password-file", passFile + ".gone"},
			exitFail, "--basic-auth.password-file"},
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
