package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"
	"unicode"

	"github.com/spf13/pflag"

	"github.com/imcanary/imcanary/config"
	"github.com/imcanary/imcanary/protocols"
)

// defaultHealthURL is the daemon's liveness endpoint at the address the
// container image makes it listen on (--http.listen=:9464).
const defaultHealthURL = "http://127.0.0.1:9464/healthz"

// runHealth asks a running daemon whether it is alive: one GET, success
// only on 200. It exists for the container image, which is distroless and
// so has no shell or curl for Docker's HEALTHCHECK to call.
//
// Docker reads exit 1 as unhealthy and reserves 2, so every failure here,
// a bad flag included, exits 1: no usageError.
func runHealth(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("health", stdout, stderr)
	url := fs.String("url", defaultHealthURL, "URL to GET; healthy only if it answers 200")
	timeout := fs.Duration("timeout", 2*time.Second, "give up after this long, connecting and reading included")
	insecure := fs.Bool("tls.insecure-skip-verify", false, "with an https URL, do not verify the server's certificate (the daemon's own, self-signed, on loopback)")
	user := fs.String("basic-auth.username", "", "user for the daemon's basic authentication (--web.config.file)")
	passFile := fs.String("basic-auth.password-file", "", "file holding that user's password (else $"+config.HealthPasswordEnv+")")
	// One line each, for Docker's health log.
	if err := parseFlags(fs, "health", args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return err
		}
		return fmt.Errorf("%w (see imcanary help health)", err)
	}
	if err := noArgs(fs, args); err != nil {
		return fmt.Errorf("%w (see imcanary help health)", err)
	}
	if *timeout <= 0 {
		return fmt.Errorf("--timeout: %v: must be positive", *timeout)
	}
	auth := healthAuth{insecure: *insecure, user: *user}
	if *user != "" {
		pass, err := readPassword(*passFile)
		if err != nil {
			return err
		}
		auth.pass = pass
	}
	status, err := checkHealth(ctx, *url, *timeout, auth)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%s: %s\n", *url, status)
	return nil
}

// healthAuth is how the health check presents itself to a daemon with a
// --web.config.file.
type healthAuth struct {
	insecure   bool
	user, pass string
}

// readPassword reads the basic-auth password from file, or from
// config.HealthPasswordEnv; an error names the file, never the content.
func readPassword(file string) (string, error) {
	if file == "" {
		if p := os.Getenv(config.HealthPasswordEnv); p != "" {
			return p, nil
		}
		return "", fmt.Errorf("--basic-auth.username needs --basic-auth.password-file or $%s", config.HealthPasswordEnv)
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("--basic-auth.password-file: %w", err)
	}
	return strings.TrimRight(string(b), "\r\n"), nil
}

// checkHealth GETs url and returns its status line if it is 200, or an
// error of one line naming the status (and the first line of the body, which
// says why for /readyz) or the transport error.
func checkHealth(ctx context.Context, url string, timeout time.Duration, auth healthAuth) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", fmt.Errorf("--url: %w", err)
	}
	client := &http.Client{Transport: &http.Transport{
		// A probe of this process's own port must not wander through an
		// HTTP_PROXY set for the traffic to the target.
		Proxy:             nil,
		DisableKeepAlives: true,
		TLSClientConfig:   &tls.Config{InsecureSkipVerify: auth.insecure},
	}}
	// Named as imcanary's requests to a target are, so that an access
	// log can tell the health check from a scrape.
	req.Header.Set("User-Agent", protocols.UserAgent())
	if auth.user != "" {
		req.SetBasicAuth(auth.user, auth.pass)
	}
	resp, err := client.Do(req)
	if err != nil {
		// *url.Error already reads `Get "URL": reason`, on one line.
		return "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		if why := firstLine(resp.Body); why != "" {
			return "", fmt.Errorf("GET %s: %s: %s", url, resp.Status, why)
		}
		return "", fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return resp.Status, nil
}

// maxReason bounds how much of an error body goes into the message: one
// line for a Docker health log, which keeps 4 KiB per check.
const maxReason = 200

// firstLine returns the first line of r, at most maxReason bytes, with
// control characters dropped so that the error stays one line.
func firstLine(r io.Reader) string {
	line, _ := bufio.NewReader(io.LimitReader(r, maxReason)).ReadString('\n')
	line = strings.Map(func(c rune) rune {
		if unicode.IsControl(c) {
			return -1
		}
		return c
	}, line)
	return strings.TrimSpace(line)
}
