package probe

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"syscall"
	"testing"

	"github.com/imcanary/imcanary/metrics"
)

func TestRedactURL(t *testing.T) {
	tests := []struct{ in, want string }{
		{"", ""},
		{"ws://127.0.0.1:4000/ws", "ws://127.0.0.1:4000/ws"},
		{"wss://user:pass@im.example.com/ws", "wss://im.example.com/ws"},
		{"wss://user@im.example.com/ws?token=abc&x=1", "wss://im.example.com/ws"},
		{"https://im.example.com/api?", "https://im.example.com/api"},
		{"https://im.example.com/#access_token=abc", "https://im.example.com/"},
		{"https://us%40er:p%3Ass@h/p", "https://h/p"},
		{"user:pass@host:5222", "host:5222"},
		{"xmpp:host?token=x", "xmpp:host"},
		{"im.example.com:5222", "im.example.com:5222"},
		{"http://[::1]:%zz", ""},
		{"wss://u:p@h/%zz", ""},
	}
	for _, tt := range tests {
		if got := RedactURL(tt.in); got != tt.want {
			t.Errorf("RedactURL(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestFailureReason(t *testing.T) {
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
	tests := []struct {
		name string
		err  error
		want string
	}{
		{"refused", fmt.Errorf("login u: dial ws://h/ws: %w", refused), metrics.ConnectRefused},
		{"dns", fmt.Errorf("dial: %w", &net.OpError{Op: "dial", Err: &net.DNSError{Err: "no such host", Name: "im.invalid", IsNotFound: true}}), metrics.ConnectDNS},
		{"dns timeout is dns", &net.DNSError{Err: "i/o timeout", Name: "im.invalid", IsTimeout: true}, metrics.ConnectDNS},
		{"context deadline", fmt.Errorf("login u: %w", context.DeadlineExceeded), metrics.ConnectTimeout},
		{"read deadline", fmt.Errorf("read: %w", os.ErrDeadlineExceeded), metrics.ConnectTimeout},
		{"reset", &net.OpError{Op: "read", Err: os.NewSyscallError("read", syscall.ECONNRESET)}, metrics.ConnectNetwork},
		{"unexpected EOF", fmt.Errorf("handshake: %w", io.ErrUnexpectedEOF), metrics.ConnectNetwork},
		{"tls alert from the server", &net.OpError{Op: "remote error", Err: errors.New("tls: bad certificate")}, metrics.ConnectTLS},
		{"tls record", tls.RecordHeaderError{Msg: "first record does not look like a TLS handshake"}, metrics.ConnectTLS},
		{"x509", &tls.CertificateVerificationError{Err: x509.UnknownAuthorityError{}}, metrics.ConnectTLS},
		{"status", fmt.Errorf("dial: %w", HandshakeStatus(502, "502 Bad Gateway")), metrics.ConnectHTTP5xx},
		{"status 302", HandshakeStatus(302, ""), metrics.ConnectHTTPOther},
		{"unauthorized wins over its cause", Unauthorized(fmt.Errorf("closed: %w", io.EOF)), metrics.ConnectUnauthorized},
		{"unknown", errors.New("unexpected login reply type \"x\""), metrics.ConnectProtocol},
		{"provisioning", Provisioning(errors.New("target refused group request")), metrics.ConnectProvisioning},
		{"provisioning keeps a network reason", Provisioning(fmt.Errorf("provision: %w", refused)), metrics.ConnectRefused},
	}
	for _, tt := range tests {
		if got := FailureReason(tt.err); got != tt.want {
			t.Errorf("%s: FailureReason(%v) = %q, want %q", tt.name, tt.err, got, tt.want)
		}
		if !slices.Contains(metrics.ConnectFailReasons, FailureReason(tt.err)) {
			t.Errorf("%s: FailureReason(%v) = %q is not in metrics.ConnectFailReasons", tt.name, tt.err, FailureReason(tt.err))
		}
	}
}

// TestDescribeRefusals: a refused upgrade reads as one, and a refusal by an
// HTTP API (a login, a registration) does not: it is no upgrade.
func TestDescribeRefusals(t *testing.T) {
	for _, tt := range []struct {
		name string
		err  error
		want string
	}{
		{"upgrade", HandshakeStatus(401, ""), "the WebSocket upgrade was answered HTTP 401 Unauthorized"},
		{"upgrade by a proxy", fmt.Errorf("dial: %w", HandshakeStatus(403, "403 Forbidden")), "the WebSocket upgrade was answered HTTP 403 Forbidden"},
		{"a registration", Unauthorized(errors.New("matrix: registering u0: HTTP 403 M_FORBIDDEN: bad mac")),
			"unauthorized: matrix: registering u0: HTTP 403 M_FORBIDDEN: bad mac"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := DescribeFailure(FailureReason(tt.err), tt.err.Error()); got != tt.want {
				t.Errorf("got %q, want %q", got, tt.want)
			}
		})
	}
}
