package openimtest

import (
	"errors"
	"fmt"
)

// OpenIM's error codes, as pkg/common/servererrs/code.go:48-91 and the
// tools module's errs/predefine.go:19-31 number them; the names are the
// CodeError messages of servererrs/predefine.go:20-67.
const (
	codeServerInternal    = 500
	codeArgs              = 1001
	codeNoPermission      = 1002
	codeRecordNotFound    = 1004
	codeUserIDNotFound    = 1101
	codeRegisteredAlready = 1102
	codeGroupIDExisted    = 1202
	codeNotInGroupYet     = 1203
	codeTokenExpired      = 1501
	codeTokenInvalid      = 1502
	codeTokenMalformed    = 1503
	codeTokenNotValidYet  = 1504
	codeTokenUnknown      = 1505
	codeTokenKicked       = 1506
	codeTokenNotExist     = 1507
	codeConnArgs          = 1602
)

var codeNames = map[int]string{
	codeServerInternal:    "ServerInternalError",
	codeArgs:              "ArgsError",
	codeNoPermission:      "NoPermissionError",
	codeRecordNotFound:    "RecordNotFoundError",
	codeUserIDNotFound:    "UserIDNotFoundError",
	codeRegisteredAlready: "RegisteredAlreadyError",
	codeGroupIDExisted:    "GroupIDExisted",
	codeNotInGroupYet:     "NotInGroupYetError",
	codeTokenExpired:      "TokenExpiredError",
	codeTokenInvalid:      "TokenInvalidError",
	codeTokenMalformed:    "TokenMalformedError",
	codeTokenNotValidYet:  "TokenNotValidYetError",
	codeTokenUnknown:      "TokenUnknownError",
	codeTokenKicked:       "TokenKickedError",
	codeTokenNotExist:     "TokenNotExistError",
	// predefine.go:63: the gateway's argument error has this message.
	codeConnArgs: "args err, need token, sendID, platformID",
}

// codeError is an OpenIM CodeError: what reaches a client as errCode,
// errMsg and errDlt. The real errMsg of an error that crossed a gRPC hop
// is the server's whole formatted error, stack trace included
// (tools mw/rpc_client_interceptor.go builds it from the status
// message); here errMsg is always the code's name and errDlt the reason.
type codeError struct {
	code   int
	detail string
}

func (e *codeError) Error() string {
	return fmt.Sprintf("%d %s: %s", e.code, codeNames[e.code], e.detail)
}

func newCode(code int, format string, a ...any) error {
	return &codeError{code: code, detail: fmt.Sprintf(format, a...)}
}

// envelope is tools apiresp.ApiResponse (tools apiresp/resp.go:25-30): every
// REST answer and the gateway's first text frame. Data is omitted when
// nil; apiresp also drops a Data whose fields are all unexported, which
// is how an empty protobuf response (UserRegisterResp) goes out.
type envelope struct {
	ErrCode int    `json:"errCode"`
	ErrMsg  string `json:"errMsg"`
	ErrDlt  string `json:"errDlt"`
	Data    any    `json:"data,omitempty"`
}

// parseError is apiresp.ParseError (tools apiresp/resp.go:77-90): a CodeError gives
// its code; anything else is 500 with the error's text as errMsg.
func parseError(err error) envelope {
	if err == nil {
		return envelope{}
	}
	var ce *codeError
	if errors.As(err, &ce) {
		return envelope{ErrCode: ce.code, ErrMsg: codeNames[ce.code], ErrDlt: ce.detail}
	}
	return envelope{ErrCode: codeServerInternal, ErrMsg: err.Error()}
}

// checker is what the protocol module's request types implement; the
// API (tools a2r/api2rpc.go:53) and every RPC server (tools
// mw/rpc_server_interceptor.go:37) call it, and a plain error from it
// becomes ArgsError (tools checker/check.go:23-33).
type checker interface{ Check() error }

func check(req any) error {
	c, ok := req.(checker)
	if !ok {
		return nil
	}
	if err := c.Check(); err != nil {
		return newCode(codeArgs, "%s", err.Error())
	}
	return nil
}
