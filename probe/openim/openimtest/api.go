package openimtest

import (
	"encoding/json"
	"io"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/openimsdk/protocol/auth"
	"github.com/openimsdk/protocol/constant"
	"github.com/openimsdk/protocol/group"
	"github.com/openimsdk/protocol/sdkws"
	"github.com/openimsdk/protocol/user"
)

// maxBody bounds a REST request body: the largest a monitor sends is a
// 1000-member create_group.
const maxBody = 1 << 20

// apiOp is who calls: the operationID header, and the user of the token
// header (empty on the routes that need no token).
type apiOp struct {
	operationID string
	userID      string
}

type route func(s *Server, op apiOp, body []byte) (any, error)

// routes are the REST routes a monitor needs, of internal/api/router.go
// (109, 115, 163, 176, 178, 199-200); every one is POST.
var routes = map[string]route{
	"/auth/get_admin_token":         (*Server).getAdminToken,
	"/auth/get_user_token":          (*Server).getUserToken,
	"/user/user_register":           (*Server).userRegister,
	"/user/account_check":           (*Server).accountCheck,
	"/group/create_group":           (*Server).createGroup,
	"/group/get_group_members_info": (*Server).getGroupMembersInfo,
	"/group/invite_user_to_group":   (*Server).inviteUserToGroup,
}

// tokenFree are the routes GinParseToken lets through without a token
// (internal/api/router.go:323-326), matched by prefix as it does.
var tokenFree = []string{"/auth/get_admin_token", "/auth/parse_token"}

// serveAPI runs the middleware of internal/api/router.go:103-104 in its
// order, then the route. Errors are HTTP 200 with an errCode, as
// apiresp writes them; an unknown route, or any non-POST, is gin's plain
// 404, after the middleware (which only checks POSTs) let it through.
func (s *Server) serveAPI(w http.ResponseWriter, r *http.Request) {
	var op apiOp
	if r.Method == http.MethodPost {
		// tools mw/gin.go:63-77.
		op.operationID = r.Header.Get(constant.OperationID)
		if op.operationID == "" {
			writeEnvelope(w, parseError(newCode(codeArgs, "header must have operationID")))
			return
		}
		// router.go:291-320: any valid token will do here; the admin-only
		// routes check the caller themselves.
		if !slices.ContainsFunc(tokenFree, func(p string) bool { return strings.HasPrefix(r.URL.Path, p) }) {
			tok := r.Header.Get(constant.Token)
			if tok == "" {
				writeEnvelope(w, parseError(newCode(codeArgs, "header must have token")))
				return
			}
			userID, _, err := s.tokens.parse(tok)
			if err != nil {
				writeEnvelope(w, parseError(err))
				return
			}
			op.userID = userID
		}
	}
	h := routes[r.URL.Path]
	if h == nil || r.Method != http.MethodPost {
		http.Error(w, "404 page not found", http.StatusNotFound)
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, maxBody))
	if err != nil {
		writeEnvelope(w, parseError(newCode(codeArgs, "read request body: %v", err)))
		return
	}
	data, err := h(s, op, body)
	if err != nil {
		s.log.Debug("api error", "path", r.URL.Path, "operationID", op.operationID, "err", err)
		writeEnvelope(w, parseError(err))
		return
	}
	writeEnvelope(w, envelope{Data: data})
}

func writeEnvelope(w http.ResponseWriter, e envelope) {
	b, err := json.Marshal(e)
	if err != nil {
		http.Error(w, "json marshal error: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(b)
}

// decode is a2r.ParseRequestNotCheck then checker.Validate (tools
// a2r/api2rpc.go:38-72): encoding/json into the protocol's own request
// type, ArgsError if that fails, then the type's Check.
func decode[T any](body []byte) (*T, error) {
	req := new(T)
	if err := json.Unmarshal(body, req); err != nil {
		return nil, newCode(codeArgs, "%s", err.Error())
	}
	if err := check(req); err != nil {
		return nil, err
	}
	return req, nil
}

// checkAdmin is authverify.CheckAdmin (pkg/authverify/token.go:48-53).
func (s *Server) checkAdmin(op apiOp) error {
	if op.userID != adminUserID {
		return newCode(codeNoPermission, "user %s is not admin userID", op.userID)
	}
	return nil
}

// checkAccess is authverify.CheckAccessV3 (pkg/authverify/token.go:33-42):
// the admin, or the user themself.
func checkAccess(opUserID, ownerUserID string) error {
	if opUserID == adminUserID || opUserID == ownerUserID {
		return nil
	}
	return newCode(codeNoPermission, "ownerUserID %s", ownerUserID)
}

// getAdminToken is internal/rpc/auth/auth.go:81-105.
func (s *Server) getAdminToken(_ apiOp, body []byte) (any, error) {
	req, err := decode[auth.GetAdminTokenReq](body)
	if err != nil {
		return nil, err
	}
	if req.Secret != s.o.Secret {
		return nil, newCode(codeNoPermission, "secret invalid")
	}
	if req.UserID != adminUserID {
		return nil, newCode(codeArgs, "userID is error.")
	}
	tok, err := s.tokens.issue(req.UserID, constant.AdminPlatformID)
	if err != nil {
		return nil, err
	}
	return &auth.GetAdminTokenResp{Token: tok, ExpireTimeSeconds: int64(tokenTTL / time.Second)}, nil
}

// getUserToken is internal/rpc/auth/auth.go:107-131. Its request Check
// builds errors and drops them (protocol auth/auth.go:47-56), so an empty
// userID fails only as an unknown user, and platformID 0 is accepted.
func (s *Server) getUserToken(op apiOp, body []byte) (any, error) {
	req, err := decode[auth.GetUserTokenReq](body)
	if err != nil {
		return nil, err
	}
	if err := s.checkAdmin(op); err != nil {
		return nil, err
	}
	if req.PlatformID == constant.AdminPlatformID {
		return nil, newCode(codeNoPermission, "platformID invalid. platformID must not be adminPlatformID")
	}
	if req.UserID == adminUserID {
		return nil, newCode(codeNoPermission, "don't get Admin token")
	}
	if s.store.user(req.UserID) == nil {
		// rpcli/user.go:32-44, CheckUser.
		return nil, newCode(codeRecordNotFound, "user not found")
	}
	tok, err := s.tokens.issue(req.UserID, int(req.PlatformID))
	if err != nil {
		return nil, err
	}
	return &auth.GetUserTokenResp{Token: tok, ExpireTimeSeconds: int64(tokenTTL / time.Second)}, nil
}

// userRegister is internal/rpc/user/user.go:271-325: all or nothing, and
// RegisteredAlreadyError if any user of the batch exists — registering
// again is not idempotent.
func (s *Server) userRegister(op apiOp, body []byte) (any, error) {
	req, err := decode[user.UserRegisterReq](body)
	if err != nil {
		return nil, err
	}
	if len(req.Users) == 0 {
		return nil, newCode(codeArgs, "users is empty")
	}
	if err := s.checkAdmin(op); err != nil {
		return nil, err
	}
	seen := make(map[string]bool, len(req.Users))
	for _, u := range req.Users {
		if seen[u.UserID] {
			return nil, newCode(codeArgs, "userID repeated")
		}
		seen[u.UserID] = true
		if u.UserID == "" {
			return nil, newCode(codeArgs, "userID is empty")
		}
		if strings.Contains(u.UserID, ":") {
			return nil, newCode(codeArgs, "userID contains ':' is invalid userID")
		}
	}
	s.store.mu.Lock()
	defer s.store.mu.Unlock()
	for _, u := range req.Users {
		if s.store.users[u.UserID] != nil {
			return nil, newCode(codeRegisteredAlready, "userID registered already")
		}
	}
	now := time.Now().UnixMilli()
	for _, u := range req.Users {
		s.store.users[u.UserID] = &sdkws.UserInfo{UserID: u.UserID, Nickname: u.Nickname, FaceURL: u.FaceURL,
			Ex: u.Ex, CreateTime: now, AppMangerLevel: u.AppMangerLevel, GlobalRecvMsgOpt: u.GlobalRecvMsgOpt}
	}
	return nil, nil // UserRegisterResp has no fields: apiresp omits data
}

// accountCheck is internal/rpc/user/user.go:224-251.
func (s *Server) accountCheck(op apiOp, body []byte) (any, error) {
	req, err := decode[user.AccountCheckReq](body)
	if err != nil {
		return nil, err
	}
	if hasDuplicate(req.CheckUserIDs) {
		return nil, newCode(codeArgs, "userID repeated")
	}
	if err := s.checkAdmin(op); err != nil {
		return nil, err
	}
	s.store.mu.Lock()
	defer s.store.mu.Unlock()
	resp := &user.AccountCheckResp{}
	for _, id := range req.CheckUserIDs {
		st := int32(constant.UnRegistered)
		if s.store.users[id] != nil {
			st = constant.Registered
		}
		resp.Results = append(resp.Results, &user.AccountCheckRespSingleUserStatus{UserID: id, AccountStatus: st})
	}
	return resp, nil
}

func hasDuplicate(ids []string) bool {
	seen := make(map[string]bool, len(ids))
	for _, id := range ids {
		if seen[id] {
			return true
		}
		seen[id] = true
	}
	return false
}

// createGroup is internal/rpc/group/group.go:204-311. The caller counts
// in memberCount even when only the owner's or the admin's token made the
// call and the caller is not a member (group.go:214-218, 277-278). The
// GroupCreatedNotification it sends (groupCreated has isSendMsg: true in
// config/notification.yml) takes the group conversation's seq 1.
func (s *Server) createGroup(op apiOp, body []byte) (any, error) {
	req, err := decode[group.CreateGroupReq](body)
	if err != nil {
		return nil, err
	}
	if req.GroupInfo.GroupType != constant.WorkingGroup {
		return nil, newCode(codeArgs, "group type only supports %d", constant.WorkingGroup)
	}
	if err := checkAccess(op.userID, req.OwnerUserID); err != nil {
		return nil, err
	}
	userIDs := slices.Concat(req.MemberUserIDs, req.AdminUserIDs, []string{req.OwnerUserID})
	if !slices.Contains(userIDs, op.userID) {
		userIDs = append(userIDs, op.userID)
	}
	if hasDuplicate(userIDs) {
		return nil, newCode(codeArgs, "group member repeated")
	}

	st := s.store
	st.mu.Lock()
	for _, id := range userIDs {
		if st.users[id] == nil {
			st.mu.Unlock()
			return nil, newCode(codeUserIDNotFound, "user not found")
		}
	}
	groupID := req.GroupInfo.GroupID
	if groupID != "" {
		if st.groups[groupID] != nil {
			st.mu.Unlock()
			return nil, newCode(codeGroupIDExisted, "group id existed %s", groupID)
		}
	} else {
		// GenGroupID (group.go:175-202): the decimal value of 32 random
		// bits.
		for groupID == "" || st.groups[groupID] != nil {
			groupID = strconv.FormatUint(uint64(rand.Uint32()), 10)
		}
	}
	now := time.Now()
	info := &sdkws.GroupInfo{
		GroupID: groupID, GroupName: req.GroupInfo.GroupName, Notification: req.GroupInfo.Notification,
		Introduction: req.GroupInfo.Introduction, FaceURL: req.GroupInfo.FaceURL, OwnerUserID: req.OwnerUserID,
		CreateTime: now.UnixMilli(), MemberCount: uint32(len(userIDs)), Ex: req.GroupInfo.Ex,
		Status: req.GroupInfo.Status, CreatorUserID: req.GroupInfo.CreatorUserID, GroupType: req.GroupInfo.GroupType,
		NeedVerification: req.GroupInfo.NeedVerification, LookMemberInfo: req.GroupInfo.LookMemberInfo,
		ApplyMemberFriend: req.GroupInfo.ApplyMemberFriend, NotificationUpdateTime: req.GroupInfo.NotificationUpdateTime,
		NotificationUserID: req.GroupInfo.NotificationUserID,
	}
	g := &groupState{info: info, members: make(map[string]*sdkws.GroupMemberFullInfo)}
	join := func(userID string, role int32) {
		g.members[userID] = &sdkws.GroupMemberFullInfo{GroupID: groupID, UserID: userID, RoleLevel: role,
			JoinTime: now.UnixMilli(), Nickname: st.users[userID].Nickname, FaceURL: st.users[userID].FaceURL,
			JoinSource: constant.JoinByInvitation, OperatorUserID: op.userID, InviterUserID: op.userID}
		g.order = append(g.order, userID)
		addTo(st.userGroups, userID, groupID)
	}
	join(req.OwnerUserID, constant.GroupOwner)
	for _, id := range req.AdminUserIDs {
		join(id, constant.GroupAdmin)
	}
	for _, id := range req.MemberUserIDs {
		join(id, constant.GroupOrdinaryUsers)
	}
	st.groups[groupID] = g
	tips := &sdkws.GroupCreatedTips{Group: info, OperationTime: now.UnixMilli(),
		GroupOwnerUser: g.members[req.OwnerUserID], OpUser: opMember(st, g, op.userID)}
	for _, id := range g.order {
		tips.MemberList = append(tips.MemberList, g.members[id])
	}
	tipsJSON, _ := json.Marshal(tips)
	st.mu.Unlock()

	s.notifyGroup(op, groupID, constant.GroupCreatedNotification, tipsJSON, "create group")
	return &group.CreateGroupResp{GroupInfo: info}, nil
}

// opMember is fillOpUser (internal/rpc/group/notification.go:236): the
// caller's member record, or a stand-in for the admin. Callers hold
// st.mu.
func opMember(st *store, g *groupState, userID string) *sdkws.GroupMemberFullInfo {
	if m := g.members[userID]; m != nil {
		return m
	}
	u := st.users[userID]
	m := &sdkws.GroupMemberFullInfo{GroupID: g.info.GroupID, UserID: userID}
	if u != nil {
		m.Nickname, m.FaceURL, m.AppMangerLevel = u.Nickname, u.FaceURL, u.AppMangerLevel
	}
	return m
}

// getGroupMembersInfo is internal/rpc/group/group.go:630-660: the members
// among userIDs, none if there is no such group.
func (s *Server) getGroupMembersInfo(_ apiOp, body []byte) (any, error) {
	req, err := decode[group.GetGroupMembersInfoReq](body)
	if err != nil {
		return nil, err
	}
	if len(req.UserIDs) == 0 {
		return nil, newCode(codeArgs, "userIDs empty")
	}
	s.store.mu.Lock()
	defer s.store.mu.Unlock()
	resp := &group.GetGroupMembersInfoResp{Members: []*sdkws.GroupMemberFullInfo{}}
	if g := s.store.groups[req.GroupID]; g != nil {
		for _, id := range req.UserIDs {
			if m := g.members[id]; m != nil {
				resp.Members = append(resp.Members, m)
			}
		}
	}
	return resp, nil
}

// inviteUserToGroup is internal/rpc/group/group.go:359-459: unknown group
// or unknown invitee RecordNotFoundError; a caller that is neither the
// admin nor a member RecordNotFoundError too (TakeGroupMember); a group
// with needVerification 1 turns an ordinary member's invitation into
// join requests, which this server does not keep. Inviting a member
// again fails on the member collection's unique index: 500. Invitees
// see the group's earlier history (enableHistoryForNewMembers: true in
// config/openim-rpc-group.yml), and a MemberInvitedNotification takes
// the next seq.
func (s *Server) inviteUserToGroup(op apiOp, body []byte) (any, error) {
	req, err := decode[group.InviteUserToGroupReq](body)
	if err != nil {
		return nil, err
	}
	if len(req.InvitedUserIDs) == 0 {
		return nil, newCode(codeArgs, "user empty")
	}
	if hasDuplicate(req.InvitedUserIDs) {
		return nil, newCode(codeArgs, "userID duplicate")
	}
	st := s.store
	st.mu.Lock()
	g := st.groups[req.GroupID]
	if g == nil {
		st.mu.Unlock()
		return nil, newCode(codeRecordNotFound, "group not found")
	}
	for _, id := range req.InvitedUserIDs {
		if st.users[id] == nil {
			st.mu.Unlock()
			return nil, newCode(codeRecordNotFound, "user not found")
		}
	}
	if op.userID != adminUserID {
		m := g.members[op.userID]
		if m == nil {
			st.mu.Unlock()
			return nil, newCode(codeRecordNotFound, "group member not found")
		}
		if g.info.NeedVerification == constant.AllNeedVerification &&
			m.RoleLevel != constant.GroupOwner && m.RoleLevel != constant.GroupAdmin {
			st.mu.Unlock()
			return nil, nil
		}
	}
	for _, id := range req.InvitedUserIDs {
		if g.members[id] != nil {
			st.mu.Unlock()
			return nil, newCode(codeServerInternal, "duplicate key: %s is a member of %s", id, req.GroupID)
		}
	}
	now := time.Now().UnixMilli()
	tips := &sdkws.MemberInvitedTips{Group: g.info, OperationTime: now}
	for _, id := range req.InvitedUserIDs {
		m := &sdkws.GroupMemberFullInfo{GroupID: req.GroupID, UserID: id, RoleLevel: constant.GroupOrdinaryUsers,
			JoinTime: now, Nickname: st.users[id].Nickname, FaceURL: st.users[id].FaceURL,
			JoinSource: constant.JoinByInvitation, OperatorUserID: op.userID, InviterUserID: op.userID}
		g.members[id] = m
		g.order = append(g.order, id)
		addTo(st.userGroups, id, req.GroupID)
		tips.InvitedUserList = append(tips.InvitedUserList, m)
	}
	tips.OpUser = opMember(st, g, op.userID)
	tips.InviterUser = tips.OpUser
	tipsJSON, _ := json.Marshal(tips)
	st.mu.Unlock()

	s.notifyGroup(op, req.GroupID, constant.MemberInvitedNotification, tipsJSON, "member invited")
	return nil, nil
}
