package mattermost

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"

	"github.com/imcanary/imcanary/probe"
	"github.com/imcanary/imcanary/probe/internal/longpoll"
)

// The API v4 JSON shapes, as far as imcanary reads them
// (https://api.mattermost.com/). Unknown fields are ignored.

// apiError is an answer with a status other than 2xx: Mattermost's AppError,
// whose id (api.user.login.invalid_credentials_email_username, …) says what.
type apiError struct {
	Status  int
	ID      string `json:"id"`
	Message string `json:"message"`
}

func (e *apiError) Error() string {
	if e.ID == "" {
		return fmt.Sprintf("HTTP %d", e.Status)
	}
	return fmt.Sprintf("HTTP %d %s: %s", e.Status, e.ID, e.Message)
}

// statusOf returns err's HTTP status, or 0 for an error without one.
func statusOf(err error) int {
	if ae, ok := errors.AsType[*apiError](err); ok {
		return ae.Status
	}
	return 0
}

// answerError turns a non-2xx answer into an *apiError. Mattermost's
// messages name the request's fault, never its credentials; they are cut
// short all the same.
func answerError(r *longpoll.Response) error {
	e := &apiError{Status: r.Status}
	_ = json.Unmarshal(r.Body, e)
	if len(e.Message) > 200 {
		e.Message = e.Message[:200]
	}
	return e
}

// user is a Mattermost user, as far as imcanary reads it.
type user struct {
	ID       string `json:"id"`
	Username string `json:"username"`
}

// channel is a channel, as far as imcanary reads it.
type channel struct {
	ID   string `json:"id"`
	Type string `json:"type"`
}

// post is a post, in an answer and inside a posted event.
type post struct {
	ID            string `json:"id"`
	CreateAt      int64  `json:"create_at"`
	UserID        string `json:"user_id"`
	ChannelID     string `json:"channel_id"`
	Message       string `json:"message"`
	Type          string `json:"type"`
	PendingPostID string `json:"pending_post_id"`
}

// postList is GET /channels/ID/posts's answer.
type postList struct {
	Order   []string         `json:"order"`
	Posts   map[string]*post `json:"posts"`
	PrevID  string           `json:"prev_post_id"`
	HasNext bool             `json:"has_next"`
}

// request builds an API request with token as its bearer (none if empty)
// and in, if not nil, as its JSON body.
func (d *Driver) request(ctx context.Context, method, path string, q url.Values, token string, in any) (*http.Request, error) {
	u := d.base + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	var req *http.Request
	var err error
	if in != nil {
		b, merr := json.Marshal(in)
		if merr != nil {
			return nil, merr
		}
		req, err = http.NewRequestWithContext(ctx, method, u, bytes.NewReader(b))
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
	// Mattermost treats a request without it as possibly cross-site for
	// token auth in a cookie; with a bearer token it is only a courtesy.
	req.Header.Set("X-Requested-With", "XMLHttpRequest")
	return req, nil
}

// call makes one API request over link, within requestTimeout, and decodes
// a 2xx answer's JSON into out (if not nil); any other status is an
// *apiError. It returns the answer for its headers.
func (d *Driver) call(ctx context.Context, link probe.Link, method, path string, q url.Values, token string, in, out any) (*longpoll.Response, error) {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	req, err := d.request(ctx, method, path, q, token, in)
	if err != nil {
		return nil, err
	}
	r, err := d.pool.Do(req, link)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", method, path, err)
	}
	return r, decodeAnswer(r, method, path, out)
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
