package matrix

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha1"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/imcanary/imcanary/probe"
	"github.com/imcanary/imcanary/probe/internal/longpoll"
)

// The client-server API's JSON shapes, as far as imcanary reads them
// (https://spec.matrix.org/v1.11/client-server-api/). Unknown fields are
// ignored, as the spec asks of clients.

// apiError is an answer with a status other than 2xx: its errcode
// (M_FORBIDDEN, M_USER_IN_USE, …) says what, the status how bad.
type apiError struct {
	Status  int
	Errcode string `json:"errcode"`
	Message string `json:"error"`
	// RetryAfter is the server's M_LIMIT_EXCEEDED wait, in ms.
	RetryAfter int64 `json:"retry_after_ms"`
}

func (e *apiError) Error() string {
	if e.Errcode == "" {
		return fmt.Sprintf("HTTP %d", e.Status)
	}
	return fmt.Sprintf("HTTP %d %s: %s", e.Status, e.Errcode, e.Message)
}

// errcodeOf returns err's Matrix errcode, or "".
func errcodeOf(err error) string {
	if ae, ok := errors.AsType[*apiError](err); ok {
		return ae.Errcode
	}
	return ""
}

// statusOf returns err's HTTP status, or 0 for an error without one.
func statusOf(err error) int {
	if ae, ok := errors.AsType[*apiError](err); ok {
		return ae.Status
	}
	return 0
}

// answerError turns a non-2xx answer into an *apiError. The server's words
// are kept: Matrix error messages name the request's fault, never its
// credentials.
func answerError(r *longpoll.Response) error {
	e := &apiError{Status: r.Status}
	_ = json.Unmarshal(r.Body, e)
	if len(e.Message) > 200 {
		e.Message = e.Message[:200]
	}
	return e
}

// request builds a request of the client-server API with token as its
// bearer (none if empty) and in, if not nil, as its JSON body.
func (d *Driver) request(ctx context.Context, method, path string, q url.Values, token string, in any) (*http.Request, error) {
	u := d.base + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	var body *bytes.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return nil, err
		}
		body = bytes.NewReader(b)
	}
	var req *http.Request
	var err error
	if body != nil {
		req, err = http.NewRequestWithContext(ctx, method, u, body)
	} else {
		req, err = http.NewRequestWithContext(ctx, method, u, nil)
	}
	if err != nil {
		return nil, err
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	return req, nil
}

// call makes one API request over link and decodes a 2xx answer's JSON
// into out (if not nil); any other status is an *apiError.
func (d *Driver) call(ctx context.Context, link probe.Link, method, path string, q url.Values, token string, in, out any) error {
	req, err := d.request(ctx, method, path, q, token, in)
	if err != nil {
		return err
	}
	r, err := d.pool.Do(req, link)
	if err != nil {
		return err
	}
	return decodeAnswer(r, method, path, out)
}

func decodeAnswer(r *longpoll.Response, method, path string, out any) error {
	if r.Status < 200 || r.Status > 299 {
		return fmt.Errorf("%s %s: %w", method, path, answerError(r))
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(r.Body, out); err != nil {
		return fmt.Errorf("%s %s: malformed answer: %w", method, path, err)
	}
	return nil
}

// register creates user with password through the registration shared
// secret (Synapse's admin API, which Dendrite serves too): a nonce, then
// the registration signed with HMAC-SHA1 over nonce, user, password and
// admin flag, NUL-separated. It returns an access token; a user that
// exists already is M_USER_IN_USE.
func (d *Driver) register(ctx context.Context, user, password string) (string, error) {
	const path = "/_synapse/admin/v1/register"
	var nonce struct {
		Nonce string `json:"nonce"`
	}
	if err := d.call(ctx, probe.Link{}, http.MethodGet, path, nil, "", nil, &nonce); err != nil {
		return "", err
	}
	if nonce.Nonce == "" {
		return "", fmt.Errorf("GET %s: no nonce in the answer", path)
	}
	mac := hmac.New(sha1.New, d.opts.Secret)
	mac.Write([]byte(nonce.Nonce + "\x00" + user + "\x00" + password + "\x00notadmin"))
	in := map[string]any{
		"nonce": nonce.Nonce, "username": user, "password": password, "admin": false,
		"mac": hex.EncodeToString(mac.Sum(nil)),
	}
	var out struct {
		AccessToken string `json:"access_token"`
	}
	if err := d.call(ctx, probe.Link{}, http.MethodPost, path, nil, "", in, &out); err != nil {
		return "", err
	}
	if out.AccessToken == "" {
		return "", fmt.Errorf("POST %s: no access_token in the answer", path)
	}
	return out.AccessToken, nil
}

// login logs user in as device deviceID with a password, which makes the
// device's previous token, if any, invalid.
func (d *Driver) login(ctx context.Context, link probe.Link, user, deviceID string) (string, error) {
	in := map[string]any{
		"type":                        "m.login.password",
		"identifier":                  map[string]string{"type": "m.id.user", "user": user},
		"password":                    d.password(user),
		"device_id":                   deviceID,
		"initial_device_display_name": "imcanary",
	}
	var out struct {
		AccessToken string `json:"access_token"`
	}
	if err := d.call(ctx, link, http.MethodPost, "/_matrix/client/v3/login", nil, "", in, &out); err != nil {
		if s := statusOf(err); s == http.StatusForbidden || s == http.StatusUnauthorized {
			return "", probe.Unauthorized(err)
		}
		return "", err
	}
	if out.AccessToken == "" {
		return "", errors.New("login: no access_token in the answer")
	}
	return out.AccessToken, nil
}

// syncAnswer is a /sync answer.
type syncAnswer struct {
	NextBatch string `json:"next_batch"`
	Rooms     struct {
		Join map[string]struct {
			Timeline timeline `json:"timeline"`
		} `json:"join"`
	} `json:"rooms"`
}

type timeline struct {
	Events    []event `json:"events"`
	Limited   bool    `json:"limited"`
	PrevBatch string  `json:"prev_batch"`
}

// event is a room event; only m.room.message events carry probe bodies.
type event struct {
	Type     string `json:"type"`
	EventID  string `json:"event_id"`
	Sender   string `json:"sender"`
	OriginTS int64  `json:"origin_server_ts"`
	Content  struct {
		MsgType string `json:"msgtype"`
		Body    string `json:"body"`
	} `json:"content"`
}

// messagesAnswer is a /messages page, newest first for dir=b.
type messagesAnswer struct {
	Chunk []event `json:"chunk"`
	End   string  `json:"end"`
}

// decodeSync decodes a /sync answer; a next_batch is required, as every
// poll after it depends on it.
func decodeSync(b []byte, out *syncAnswer) error {
	*out = syncAnswer{}
	if err := json.Unmarshal(b, out); err != nil {
		return fmt.Errorf("malformed /sync answer: %w", err)
	}
	if out.NextBatch == "" {
		return errors.New("malformed /sync answer: no next_batch")
	}
	return nil
}

// decodeMessages decodes a /messages page.
func decodeMessages(b []byte, out *messagesAnswer) error {
	*out = messagesAnswer{}
	if err := json.Unmarshal(b, out); err != nil {
		return fmt.Errorf("malformed /messages answer: %w", err)
	}
	return nil
}

// filter is the inline /sync filter every session uses: room messages
// only, timeline_limit of them per room and answer, nothing else the
// server would otherwise send (presence, account data, receipts, state).
func filter(limit int) string {
	return `{"presence":{"types":[]},"account_data":{"types":[]},"room":{"state":{"types":[]},` +
		`"ephemeral":{"types":[]},"account_data":{"types":[]},"timeline":{"limit":` + strconv.Itoa(limit) +
		`,"types":["m.room.message"]}}}`
}

// messagesFilter keeps /messages to room messages.
const messagesFilter = `{"types":["m.room.message"]}`

// retryAfter is how long to wait before retrying after err: the server's
// word for a 429, else a doubling backoff from 100 ms.
func retryAfter(err error, attempt int) time.Duration {
	if ae, ok := errors.AsType[*apiError](err); ok && ae.RetryAfter > 0 {
		return min(time.Duration(ae.RetryAfter)*time.Millisecond, 10*time.Second)
	}
	return min(100*time.Millisecond<<attempt, 5*time.Second)
}
