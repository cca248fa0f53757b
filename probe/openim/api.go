package openim

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/openimsdk/protocol/auth"
	"github.com/openimsdk/protocol/constant"
	"github.com/openimsdk/protocol/group"
	"github.com/openimsdk/protocol/sdkws"
	"github.com/openimsdk/protocol/user"

	"github.com/imcanary/imcanary/probe"
)

// OpenIM's REST API (internal/api/router.go): every call is a POST of JSON
// with an operationID header, the admin calls with the admin token in a
// token header, and every answer is {"errCode","errMsg","errDlt","data"}
// with HTTP 200 whatever the outcome. The request and answer bodies are the
// protocol module's own types, which the API binds with encoding/json.

// OpenIM's error codes that imcanary tells apart (pkg/common/servererrs
// code.go in open-im-server v3.8.3).
const (
	errRegisteredAlready = 1102
	errGroupIDExisted    = 1202
	// errTokenFirst..errTokenLast are the token errors: expired,
	// invalid, malformed, not valid yet, unknown, kicked, not exist.
	errTokenFirst = 1501
	errTokenLast  = 1507
	// errNoPermission is the admin token refused for a wrong secret.
	errNoPermission = 1002
)

// apiError is an answer whose errCode is not 0.
type apiError struct {
	Path string
	Code int    `json:"errCode"`
	Msg  string `json:"errMsg"`
	Dlt  string `json:"errDlt"`
}

func (e *apiError) Error() string {
	return fmt.Sprintf("%s: OpenIM error %d %s", e.Path, e.Code, errText(e.Msg))
}

// codeOf returns err's OpenIM error code, 0 for an error without one.
func codeOf(err error) int {
	if ae, ok := errors.AsType[*apiError](err); ok {
		return ae.Code
	}
	return 0
}

// isTokenError reports whether OpenIM refused a token: the login or call
// needs a new one.
func isTokenError(code int) bool { return code >= errTokenFirst && code <= errTokenLast }

// maxAnswer bounds what one REST answer may hold; a page of 500 users'
// account statuses is some 30 KiB.
const maxAnswer = 4 << 20

// requestTimeout bounds one REST call.
const requestTimeout = 30 * time.Second

// opSeq numbers the operation ids of the driver's requests: OpenIM logs
// each request under its operationID, so an operator can find imcanary's
// in the server's logs.
var opSeq atomic.Uint64

// operationID returns a fresh operationID.
func (d *Driver) operationID() string {
	return "imcanary-" + d.nonce + "-" + strconv.FormatUint(opSeq.Add(1), 36)
}

// call POSTs in to path, with token as the token header unless empty, and
// decodes the answer's data into out unless nil.
func (d *Driver) call(ctx context.Context, path, token string, in, out any) error {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	body, err := json.Marshal(in)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, d.cfg.APIURL+path, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("operationID", d.operationID())
	if token != "" {
		req.Header.Set("token", token)
	}
	r, err := d.pool.Do(req, probe.Link{})
	if err != nil {
		return err
	}
	if r.Status != http.StatusOK {
		return fmt.Errorf("POST %s: %w", path, probe.HandshakeStatus(r.Status, strconv.Itoa(r.Status)+" "+http.StatusText(r.Status)))
	}
	var env struct {
		apiError
		Data json.RawMessage `json:"data"`
	}
	if err := json.Unmarshal(r.Body, &env); err != nil {
		return fmt.Errorf("POST %s: answer is not OpenIM's JSON envelope: %w", path, err)
	}
	if env.Code != 0 {
		e := env.apiError
		// errDlt is the server's stack; errMsg is cut and cleaned
		// where it is shown (errText).
		e.Path, e.Dlt = path, ""
		return &e
	}
	if out == nil || len(env.Data) == 0 {
		return nil
	}
	if err := json.Unmarshal(env.Data, out); err != nil {
		return fmt.Errorf("POST %s: answer's data: %w", path, err)
	}
	return nil
}

// adminToken returns the admin token, getting one with the API secret when
// there is none or it is near its expiry.
func (d *Driver) adminToken(ctx context.Context) (string, error) {
	d.tmu.Lock()
	tok, exp := d.admin, d.adminExp
	d.tmu.Unlock()
	if tok != "" && time.Until(exp) > time.Minute {
		return tok, nil
	}
	var resp auth.GetAdminTokenResp
	err := d.call(ctx, "/auth/get_admin_token", "", &auth.GetAdminTokenReq{Secret: string(d.key.Bytes()), UserID: d.cfg.AdminUserID}, &resp)
	if err != nil {
		if c := codeOf(err); c == errNoPermission || isTokenError(c) {
			// A wrong secret: the error says so without it.
			return "", probe.Unauthorized(fmt.Errorf("admin token for %s refused (is the API secret share.yml's?): %w", d.cfg.AdminUserID, err))
		}
		return "", err
	}
	if resp.Token == "" {
		return "", errors.New("/auth/get_admin_token: answer holds no token")
	}
	d.tmu.Lock()
	d.admin, d.adminExp = resp.Token, expiry(resp.ExpireTimeSeconds)
	d.tmu.Unlock()
	return resp.Token, nil
}

// dropAdmin forgets the admin token after OpenIM refused it.
func (d *Driver) dropAdmin() {
	d.tmu.Lock()
	d.admin = ""
	d.tmu.Unlock()
}

// expiry is when a token that OpenIM says lasts secs expires, with a
// day's worth when it says nothing.
func expiry(secs int64) time.Time {
	if secs <= 0 {
		secs = 86400
	}
	return time.Now().Add(time.Duration(secs) * time.Second)
}

// adminCall is call with the admin token, got again once if OpenIM
// refused the one held (it expired, or the server restarted with another
// secret).
func (d *Driver) adminCall(ctx context.Context, path string, in, out any) error {
	for try := 0; ; try++ {
		tok, err := d.adminToken(ctx)
		if err != nil {
			return err
		}
		err = d.call(ctx, path, tok, in, out)
		if try == 0 && isTokenError(codeOf(err)) {
			d.dropAdmin()
			continue
		}
		return err
	}
}

// userToken returns user's token on platform, from the cache unless fresh.
func (d *Driver) userToken(ctx context.Context, userID string, platform int32, fresh bool) (string, error) {
	k := tokenKey{userID, platform}
	if !fresh {
		d.tmu.Lock()
		t, ok := d.tokens[k]
		d.tmu.Unlock()
		if ok && time.Until(t.exp) > time.Minute {
			return t.token, nil
		}
	}
	var resp auth.GetUserTokenResp
	if err := d.adminCall(ctx, "/auth/get_user_token", &auth.GetUserTokenReq{PlatformID: platform, UserID: openimID(userID)}, &resp); err != nil {
		return "", fmt.Errorf("token of %s on platform %d: %w", userID, platform, err)
	}
	d.tmu.Lock()
	d.tokens[k] = userTok{token: resp.Token, exp: expiry(resp.ExpireTimeSeconds)}
	d.tmu.Unlock()
	return resp.Token, nil
}

// dropToken forgets user's token on platform: OpenIM kicked it (a login
// on the same platform elsewhere) or refused it.
func (d *Driver) dropToken(userID string, platform int32) {
	d.tmu.Lock()
	delete(d.tokens, tokenKey{userID, platform})
	d.tmu.Unlock()
}

type tokenKey struct {
	user     string
	platform int32
}

type userTok struct {
	token string
	exp   time.Time
}

// batch is how many users one account check or registration carries:
// OpenIM takes lists of up to 1000 ids (constant.ParamMaxLength).
const batch = 500

// provisionWorkers is how many REST calls provisioning has in flight.
const provisionWorkers = 8

// Provision implements probe.Driver: the users missing on the server are
// registered, each group is created with its members, or, if it exists,
// given those it lacks. Run again, it finds everything there and changes
// nothing.
func (d *Driver) Provision(ctx context.Context, plan probe.Plan) error {
	for i := 0; i < len(plan.Users); i += batch {
		if err := d.register(ctx, plan.Users[i:min(i+batch, len(plan.Users))]); err != nil {
			return err
		}
	}
	return probe.Parallel(ctx, len(plan.Groups), provisionWorkers, func(ctx context.Context, i int) error {
		return d.ensureGroup(ctx, plan.Groups[i])
	})
}

// register registers those of users OpenIM does not know.
func (d *Driver) register(ctx context.Context, names []string) error {
	users := make([]string, len(names))
	for i, n := range names {
		users[i] = openimID(n)
	}
	var check user.AccountCheckResp
	if err := d.adminCall(ctx, "/user/account_check", &user.AccountCheckReq{CheckUserIDs: users}, &check); err != nil {
		return fmt.Errorf("provision: %w", err)
	}
	known := make(map[string]bool, len(check.Results))
	for _, r := range check.Results {
		if r.AccountStatus == constant.Registered {
			known[r.UserID] = true
		}
	}
	var req user.UserRegisterReq
	for _, u := range users {
		if !known[u] {
			req.Users = append(req.Users, &sdkws.UserInfo{UserID: u, Nickname: userName(u)})
		}
	}
	if len(req.Users) == 0 {
		return nil
	}
	err := d.adminCall(ctx, "/user/user_register", &req, nil)
	// Another imcanary (a shard, a restart racing the last) registered
	// some meanwhile: the batch fails whole, so register one by one.
	if codeOf(err) == errRegisteredAlready {
		for _, u := range req.Users {
			err := d.adminCall(ctx, "/user/user_register", &user.UserRegisterReq{Users: []*sdkws.UserInfo{u}}, nil)
			if err != nil && codeOf(err) != errRegisteredAlready {
				return fmt.Errorf("provision: register %s: %w", u.UserID, err)
			}
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("provision: register %d users: %w", len(req.Users), err)
	}
	return nil
}

// groupType is a working group (constant.WorkingGroup), the only type
// OpenIM v3 creates; its messages are read-group chats (sg_ conversations).
const groupType = 2

// ensureGroup creates g with its first member as owner, or, if it exists,
// invites the members it lacks.
func (d *Driver) ensureGroup(ctx context.Context, g probe.Group) error {
	if len(g.Members) == 0 {
		return fmt.Errorf("provision: group %s has no members", g.Name)
	}
	members := make([]string, len(g.Members))
	for i, m := range g.Members {
		members[i] = openimID(m)
	}
	err := d.adminCall(ctx, "/group/create_group", &group.CreateGroupReq{
		OwnerUserID: members[0], MemberUserIDs: members[1:],
		GroupInfo: &sdkws.GroupInfo{GroupID: g.Name, GroupName: g.Name, GroupType: groupType},
	}, nil)
	if err == nil {
		return nil
	}
	if codeOf(err) != errGroupIDExisted {
		return fmt.Errorf("provision: create group %s: %w", g.Name, err)
	}
	var have group.GetGroupMembersInfoResp
	if err := d.adminCall(ctx, "/group/get_group_members_info", &group.GetGroupMembersInfoReq{GroupID: g.Name, UserIDs: members}, &have); err != nil {
		return fmt.Errorf("provision: members of group %s: %w", g.Name, err)
	}
	var missing []string
	for _, m := range members {
		if !slices.ContainsFunc(have.Members, func(f *sdkws.GroupMemberFullInfo) bool { return f.UserID == m }) {
			missing = append(missing, m)
		}
	}
	if len(missing) == 0 {
		return nil
	}
	if err := d.adminCall(ctx, "/group/invite_user_to_group", &group.InviteUserToGroupReq{GroupID: g.Name, InvitedUserIDs: missing, Reason: "imcanary"}, nil); err != nil {
		return fmt.Errorf("provision: invite %d members to group %s: %w", len(missing), g.Name, err)
	}
	return nil
}
