package probe

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"syscall"

	"github.com/imcanary/imcanary/metrics"
)

// ConnectError is a failed connect, login or provisioning step whose reason
// its adapter knows better than the error's type can tell: a login the
// server refused, or a WebSocket upgrade answered with an HTTP status.
// Reason is one of metrics.ConnectFailReasons.
type ConnectError struct {
	Reason string
	Err    error
}

func (e *ConnectError) Error() string { return e.Err.Error() }
func (e *ConnectError) Unwrap() error { return e.Err }

// Unauthorized marks err as a login the server refused for its
// credentials: a bad token or password, whatever the protocol's way of
// saying so.
func Unauthorized(err error) error {
	return &ConnectError{Reason: metrics.ConnectUnauthorized, Err: err}
}

// HandshakeStatus is the error of a WebSocket upgrade that the server
// answered with status code instead of 101, classed by the code: 401 and
// 403 are unauthorized (an auth proxy, or a server that checks the token
// in the upgrade), 4xx and 5xx their classes, anything else http_other.
// The body is left out: it is the server's to word, and may echo what the
// request carried.
func HandshakeStatus(code int, status string) error {
	reason := metrics.ConnectHTTPOther
	switch {
	case code == http.StatusUnauthorized || code == http.StatusForbidden:
		reason = metrics.ConnectUnauthorized
	case code >= 400 && code < 500:
		reason = metrics.ConnectHTTP4xx
	case code >= 500 && code < 600:
		reason = metrics.ConnectHTTP5xx
	}
	if status == "" {
		status = fmt.Sprintf("%d %s", code, http.StatusText(code))
	}
	return &ConnectError{Reason: reason, Err: fmt.Errorf("%sHTTP %s", upgradeAnswered, status)}
}

// upgradeAnswered starts the error of an upgrade answered with a status:
// DescribeFailure words those apart from an HTTP API's answers (a login
// or a registration refused), which are not upgrades.
const upgradeAnswered = "WebSocket upgrade answered "

// Provisioning marks err as a failure of provisioning itself (a group the
// server would not create), unless it already has a reason of its own: a
// provisioning step that could not connect failed for that reason.
func Provisioning(err error) error {
	if r := failureReason(err); r != "" {
		return err
	}
	return &ConnectError{Reason: metrics.ConnectProvisioning, Err: err}
}

// FailureReason classes the error of a failed connect, login or
// provisioning attempt into one of metrics.ConnectFailReasons: the reason
// an adapter gave it (ConnectError), else what the network error says,
// else protocol (the server answered, but not as the protocol expects).
func FailureReason(err error) string {
	if r := failureReason(err); r != "" {
		return r
	}
	return metrics.ConnectProtocol
}

// failureReason is FailureReason without the fallback: "" when err says
// nothing about why.
func failureReason(err error) string {
	if ce, ok := errors.AsType[*ConnectError](err); ok && ce.Reason != "" {
		return ce.Reason
	}
	// Order matters: a DNS lookup that timed out is a DNS problem, and a
	// TLS handshake cut by a reset is a network one only if nothing TLS
	// said otherwise.
	if _, ok := errors.AsType[*net.DNSError](err); ok {
		return metrics.ConnectDNS
	}
	if isTLS(err) {
		return metrics.ConnectTLS
	}
	if errors.Is(err, syscall.ECONNREFUSED) {
		return metrics.ConnectRefused
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded) {
		return metrics.ConnectTimeout
	}
	if ne, ok := errors.AsType[net.Error](err); ok && ne.Timeout() {
		return metrics.ConnectTimeout
	}
	for _, e := range []error{
		syscall.ECONNRESET, syscall.ECONNABORTED, syscall.EPIPE, syscall.EHOSTUNREACH,
		syscall.ENETUNREACH, syscall.EADDRNOTAVAIL, io.EOF, io.ErrUnexpectedEOF, net.ErrClosed,
	} {
		if errors.Is(err, e) {
			return metrics.ConnectNetwork
		}
	}
	if _, ok := errors.AsType[*net.OpError](err); ok {
		return metrics.ConnectNetwork
	}
	return ""
}

// isTLS reports whether err comes from a TLS handshake: a certificate the
// client does not trust, a peer that is not speaking TLS, or an alert.
func isTLS(err error) bool {
	if _, ok := errors.AsType[*tls.CertificateVerificationError](err); ok {
		return true
	}
	if _, ok := errors.AsType[tls.RecordHeaderError](err); ok {
		return true
	}
	if _, ok := errors.AsType[tls.AlertError](err); ok {
		return true
	}
	if _, ok := errors.AsType[x509.UnknownAuthorityError](err); ok {
		return true
	}
	if _, ok := errors.AsType[x509.HostnameError](err); ok {
		return true
	}
	if _, ok := errors.AsType[x509.CertificateInvalidError](err); ok {
		return true
	}
	// An alert the server sent, such as "bad certificate" for a client
	// certificate it refused, comes back as this OpError.
	if oe, ok := errors.AsType[*net.OpError](err); ok && oe.Op == "remote error" {
		return true
	}
	return false
}

// RedactURL strips a URL of what may hold a credential: userinfo, query
// and fragment. What cannot be parsed is not shown at all.
func RedactURL(s string) string {
	if s == "" {
		return ""
	}
	u, err := url.Parse(s)
	if err != nil {
		return ""
	}
	if u.Opaque != "" {
		// "user:pass@host" parses as scheme "user" with opaque
		// "pass@host": keep only what follows the last '@'.
		o, _, _ := strings.Cut(u.Opaque, "?")
		if i := strings.LastIndexByte(o, '@'); i >= 0 {
			return o[i+1:]
		}
		return u.Scheme + ":" + o
	}
	u.User = nil
	u.RawQuery, u.ForceQuery = "", false
	u.Fragment, u.RawFragment = "", ""
	return u.String()
}

// DescribeFailure puts a connect failure's reason (FailureReason) and its
// error text in words. The error's innermost part, where the network or
// the server said what went wrong, follows in parentheses when it adds
// something to the reason's own words.
func DescribeFailure(reason, err string) string {
	what, ok := failureWords[reason]
	if !ok {
		what = reason
	}
	detail := innermost(err)
	switch {
	case detail == "":
		return what
	case strings.Contains(detail, upgradeAnswered) && (strings.HasPrefix(reason, "http_") || reason == metrics.ConnectUnauthorized):
		// The status line says it all: "HTTP 404 Not Found".
		return "the WebSocket upgrade was answered " + detail[strings.Index(detail, upgradeAnswered)+len(upgradeAnswered):]
	case reason == metrics.ConnectUnauthorized:
		// The server's own words say how: "login refused: close 4001
		// "bad token"", "authentication failed: not-authorized".
		return what + ": " + detail
	}
	return what + " (" + detail + ")"
}

var failureWords = map[string]string{
	metrics.ConnectRefused:      "connection refused",
	metrics.ConnectTimeout:      "timed out",
	metrics.ConnectDNS:          "DNS lookup failed",
	metrics.ConnectTLS:          "TLS handshake failed",
	metrics.ConnectNetwork:      "network error",
	metrics.ConnectHTTP4xx:      "the WebSocket upgrade was refused",
	metrics.ConnectHTTP5xx:      "the WebSocket upgrade failed on the server",
	metrics.ConnectHTTPOther:    "the WebSocket upgrade was not accepted",
	metrics.ConnectUnauthorized: "unauthorized",
	metrics.ConnectProtocol:     "protocol error",
	metrics.ConnectProvisioning: "provisioning failed",
}

// innermost returns the part of an error's text that says what went
// wrong, without the prefixes that only say where: "provision: ", "login
// USER: " and "dial URL: " as the adapters wrap, then from the network
// operation on ("dial tcp …: connect: connection refused") when there is
// one. It only shortens a message that stays true.
func innermost(err string) string {
	for {
		switch {
		case strings.HasPrefix(err, "provision: "):
			err = strings.TrimPrefix(err, "provision: ")
			continue
		case strings.HasPrefix(err, "login "), strings.HasPrefix(err, "dial ws"):
			if i := strings.Index(err, ": "); i >= 0 {
				err = err[i+2:]
				continue
			}
		}
		break
	}
	for _, op := range []string{"dial tcp", "read tcp", "write tcp", "lookup "} {
		if i := strings.Index(err, op); i >= 0 {
			return err[i:]
		}
	}
	return err
}
