package openimtest

import (
	"bytes"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/openimsdk/protocol/auth"
	"github.com/openimsdk/protocol/constant"
	"github.com/openimsdk/protocol/group"
	"github.com/openimsdk/protocol/sdkws"
	"github.com/openimsdk/protocol/user"
)

func TestNewRefusesBadOptions(t *testing.T) {
	for _, o := range []Options{
		{},
		{Secret: "x", Faults: Faults{DropPush: 1.5}},
		{Secret: "x", Faults: Faults{Unstored: -0.1}},
		{Secret: "x", Faults: Faults{PushDelay: -1}},
	} {
		if s, err := New(o); err == nil {
			s.Close()
			t.Errorf("New(%+v) = nil error, want one", o)
		}
	}
}

func TestAPIErrors(t *testing.T) {
	s := newServer(t, Options{})
	admin := adminToken(t, s)
	register(t, s, admin, "alice", "bob")
	alice := userToken(t, s, admin, "alice", constant.WindowsPlatformID)

	tests := []struct {
		name, path, token string
		body              any
		code              int
	}{
		{"wrong secret", "/auth/get_admin_token", "", &auth.GetAdminTokenReq{Secret: "nope", UserID: adminUserID}, codeNoPermission},
		{"admin token for a non-admin", "/auth/get_admin_token", "", &auth.GetAdminTokenReq{Secret: testSecret, UserID: "alice"}, codeArgs},
		{"admin token without userID", "/auth/get_admin_token", "", &auth.GetAdminTokenReq{Secret: testSecret}, codeArgs},
		{"no token header", "/user/user_register", "", &user.UserRegisterReq{}, codeArgs},
		{"garbage token", "/user/user_register", "garbage", &user.UserRegisterReq{}, codeTokenMalformed},
		{"register again", "/user/user_register", admin,
			&user.UserRegisterReq{Users: []*sdkws.UserInfo{{UserID: "carol", Nickname: "c"}, {UserID: "alice", Nickname: "a"}}}, codeRegisteredAlready},
		// protocol util/datautil/string.go:6-13: letters, digits, _.
		{"userID with a hyphen", "/user/user_register", admin, &user.UserRegisterReq{Users: []*sdkws.UserInfo{{UserID: "canary-1", Nickname: "c"}}}, codeArgs},
		{"register without nickname", "/user/user_register", admin, &user.UserRegisterReq{Users: []*sdkws.UserInfo{{UserID: "dave"}}}, codeArgs},
		{"register as a user", "/user/user_register", alice, &user.UserRegisterReq{Users: []*sdkws.UserInfo{{UserID: "erin", Nickname: "e"}}}, codeNoPermission},
		{"token of an unknown user", "/auth/get_user_token", admin, &auth.GetUserTokenReq{UserID: "zed", PlatformID: 3}, codeRecordNotFound},
		{"token asked by a user", "/auth/get_user_token", alice, &auth.GetUserTokenReq{UserID: "bob", PlatformID: 3}, codeNoPermission},
		{"token for the admin platform", "/auth/get_user_token", admin, &auth.GetUserTokenReq{UserID: "bob", PlatformID: constant.AdminPlatformID}, codeNoPermission},
		{"account check as a user", "/user/account_check", alice, &user.AccountCheckReq{CheckUserIDs: []string{"bob"}}, codeNoPermission},
		{"group of another owner", "/group/create_group", alice,
			&group.CreateGroupReq{OwnerUserID: "bob", GroupInfo: &sdkws.GroupInfo{GroupType: constant.WorkingGroup}}, codeNoPermission},
		{"group of a normal type", "/group/create_group", admin,
			&group.CreateGroupReq{OwnerUserID: "bob", GroupInfo: &sdkws.GroupInfo{GroupType: constant.NormalGroup}}, codeArgs},
		{"group with an unknown member", "/group/create_group", admin,
			&group.CreateGroupReq{OwnerUserID: "bob", MemberUserIDs: []string{"zed"}, GroupInfo: &sdkws.GroupInfo{GroupType: constant.WorkingGroup}}, codeUserIDNotFound},
		{"invite to an unknown group", "/group/invite_user_to_group", admin,
			&group.InviteUserToGroupReq{GroupID: "nosuch", InvitedUserIDs: []string{"bob"}}, codeRecordNotFound},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if e := call(t, s, tt.path, tt.token, tt.body); e.ErrCode != tt.code {
				t.Errorf("POST %s = %d %s %s, want %d", tt.path, e.ErrCode, e.ErrMsg, e.ErrDlt, tt.code)
			}
		})
	}
	// The failed batch registered nobody.
	var ac user.AccountCheckResp
	mustOK(t, s, "/user/account_check", admin, &user.AccountCheckReq{CheckUserIDs: []string{"carol"}}, &ac)
	if len(ac.Results) != 1 || ac.Results[0].AccountStatus != constant.UnRegistered {
		t.Errorf("account_check(carol) after a refused batch = %v, want unregistered", ac.Results)
	}
}

func TestAPIEnvelope(t *testing.T) {
	s := newServer(t, Options{})
	post := func(path string, header map[string]string, body string) (int, string) {
		req, _ := http.NewRequest(http.MethodPost, s.APIURL()+path, strings.NewReader(body))
		for k, v := range header {
			req.Header.Set(k, v)
		}
		resp, err := httpClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	// Errors are HTTP 200 with the envelope, data left out.
	code, body := post("/auth/get_admin_token", nil, `{}`)
	if code != http.StatusOK || body != `{"errCode":1001,"errMsg":"ArgsError","errDlt":"header must have operationID"}` {
		t.Errorf("no operationID: %d %s", code, body)
	}
	code, body = post("/auth/get_admin_token", map[string]string{"operationID": "x"}, `{"secret":`)
	if code != http.StatusOK || !strings.HasPrefix(body, `{"errCode":1001,`) {
		t.Errorf("bad JSON: %d %s", code, body)
	}
	// An unknown route passes the middleware, then is gin's plain 404.
	code, body = post("/nosuch", map[string]string{"operationID": "x"}, `{}`)
	if code != http.StatusOK || !strings.Contains(body, `"errCode":1001`) {
		t.Errorf("unknown route without a token: %d %s, want the token middleware's 1001", code, body)
	}
	admin := adminToken(t, s)
	code, _ = post("/nosuch", map[string]string{"operationID": "x", "token": admin}, `{}`)
	if code != http.StatusNotFound {
		t.Errorf("unknown route with a token: status %d, want 404", code)
	}
	resp, err := httpClient.Get(s.APIURL() + "/auth/get_admin_token")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("GET: status %d, want 404", resp.StatusCode)
	}
	// An empty response (UserRegisterResp) leaves data out.
	_, body = post("/user/user_register", map[string]string{"operationID": "x", "token": admin},
		`{"users":[{"userID":"u1","nickname":"n"}]}`)
	if body != `{"errCode":0,"errMsg":"","errDlt":""}` {
		t.Errorf("register: %s", body)
	}
	// account_check answers every ID, with accountStatus 1 or 0 (the
	// protocol's JSON tags keep zeros).
	_, body = post("/user/account_check", map[string]string{"operationID": "x", "token": admin},
		`{"checkUserIDs":["u1","u2"]}`)
	want := `{"errCode":0,"errMsg":"","errDlt":"","data":{"results":[{"userID":"u1","accountStatus":1},{"userID":"u2","accountStatus":0}]}}`
	if body != want {
		t.Errorf("account_check = %s, want %s", body, want)
	}
	var tok auth.GetAdminTokenResp
	mustOK(t, s, "/auth/get_admin_token", "", &auth.GetAdminTokenReq{Secret: testSecret, UserID: adminUserID}, &tok)
	if tok.ExpireTimeSeconds != 90*24*3600 || tok.Token == "" || tok.Token == admin {
		t.Errorf("admin token = %+v, want a new token for 90 days", &tok)
	}
}

func TestAPIGroups(t *testing.T) {
	s := newServer(t, Options{})
	admin := adminToken(t, s)
	register(t, s, admin, "owner", "m1", "m2", "late")
	var cg group.CreateGroupResp
	mustOK(t, s, "/group/create_group", admin, &group.CreateGroupReq{
		OwnerUserID: "owner", MemberUserIDs: []string{"m1", "m2"},
		GroupInfo: &sdkws.GroupInfo{GroupID: "g1", GroupName: "G", GroupType: constant.WorkingGroup},
	}, &cg)
	// The caller (imAdmin) counts though it is not a member
	// (group.go:214-218, 277-278).
	if cg.GroupInfo.GroupID != "g1" || cg.GroupInfo.OwnerUserID != "owner" || cg.GroupInfo.MemberCount != 4 {
		t.Errorf("create_group = %+v, want g1 owned by owner with memberCount 4", cg.GroupInfo)
	}
	if e := call(t, s, "/group/create_group", admin, &group.CreateGroupReq{OwnerUserID: "owner",
		GroupInfo: &sdkws.GroupInfo{GroupID: "g1", GroupType: constant.WorkingGroup}}); e.ErrCode != codeGroupIDExisted {
		t.Errorf("create_group(g1) again = %d, want %d", e.ErrCode, codeGroupIDExisted)
	}
	// No groupID: the server picks a decimal one.
	var gen group.CreateGroupResp
	mustOK(t, s, "/group/create_group", admin, &group.CreateGroupReq{OwnerUserID: "owner",
		GroupInfo: &sdkws.GroupInfo{GroupType: constant.WorkingGroup}}, &gen)
	if id := gen.GroupInfo.GroupID; id == "" || strings.Trim(id, "0123456789") != "" {
		t.Errorf("generated groupID = %q, want decimal digits", id)
	}

	var mi group.GetGroupMembersInfoResp
	mustOK(t, s, "/group/get_group_members_info", admin, &group.GetGroupMembersInfoReq{GroupID: "g1",
		UserIDs: []string{"owner", "m1", "late", adminUserID}}, &mi)
	roles := map[string]int32{}
	for _, m := range mi.Members {
		roles[m.UserID] = m.RoleLevel
	}
	if len(roles) != 2 || roles["owner"] != constant.GroupOwner || roles["m1"] != constant.GroupOrdinaryUsers {
		t.Errorf("members info = %v, want owner 100 and m1 20 only", roles)
	}

	m1 := userToken(t, s, admin, "m1", constant.WindowsPlatformID)
	mustOK(t, s, "/group/invite_user_to_group", m1, &group.InviteUserToGroupReq{GroupID: "g1", InvitedUserIDs: []string{"late"}}, nil)
	if e := call(t, s, "/group/invite_user_to_group", admin,
		&group.InviteUserToGroupReq{GroupID: "g1", InvitedUserIDs: []string{"late"}}); e.ErrCode != codeServerInternal {
		t.Errorf("invite a member again = %d, want %d", e.ErrCode, codeServerInternal)
	}
	late := userToken(t, s, admin, "late", constant.WindowsPlatformID)
	if e := call(t, s, "/group/invite_user_to_group", late,
		&group.InviteUserToGroupReq{GroupID: gen.GroupInfo.GroupID, InvitedUserIDs: []string{"m2"}}); e.ErrCode != codeRecordNotFound {
		t.Errorf("invite by a non-member = %d, want %d", e.ErrCode, codeRecordNotFound)
	}
	mustOK(t, s, "/group/get_group_members_info", admin, &group.GetGroupMembersInfoReq{GroupID: "g1", UserIDs: []string{"late"}}, &mi)
	if len(mi.Members) != 1 || mi.Members[0].InviterUserID != "m1" {
		t.Errorf("late's membership = %v, want one invited by m1", mi.Members)
	}
	// An unknown group has no members: an empty list, not an error.
	e := call(t, s, "/group/get_group_members_info", admin, &group.GetGroupMembersInfoReq{GroupID: "nosuch", UserIDs: []string{"m1"}})
	if e.ErrCode != 0 || !bytes.Equal(e.Data, []byte(`{"members":[]}`)) {
		t.Errorf("members of an unknown group = %d %s", e.ErrCode, e.Data)
	}
}

// TestTokenPolicy follows a user's tokens through multiLogin policy 1.
func TestTokenPolicy(t *testing.T) {
	s := newServer(t, Options{})
	admin := adminToken(t, s)
	register(t, s, admin, "u")
	parse := func(tok string) int {
		_, _, err := s.tokens.parse(tok)
		return parseError(err).ErrCode
	}
	win1 := userToken(t, s, admin, "u", constant.WindowsPlatformID)
	web := userToken(t, s, admin, "u", constant.WebPlatformID)
	win2 := userToken(t, s, admin, "u", constant.WindowsPlatformID)
	if got := parse(win1); got != codeTokenKicked {
		t.Errorf("older Windows token after a new one = %d, want %d", got, codeTokenKicked)
	}
	if got := parse(web); got != 0 {
		t.Errorf("Web token after a new Windows one = %d, want 0", got)
	}
	win3 := userToken(t, s, admin, "u", constant.WindowsPlatformID)
	if got := parse(win1); got != codeTokenNotExist {
		t.Errorf("kicked token after another issue = %d, want %d (deleted)", got, codeTokenNotExist)
	}
	if got, got3 := parse(win2), parse(win3); got != codeTokenKicked || got3 != 0 {
		t.Errorf("tokens 2 and 3 = %d %d, want %d 0", got, got3, codeTokenKicked)
	}
	// Admin tokens are not kept, so a new one leaves the old valid.
	if a2 := adminToken(t, s); parse(admin) != 0 || parse(a2) != 0 {
		t.Errorf("admin tokens: %d %d, want both valid", parse(admin), parse(a2))
	}
}
