package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/imcanary/imcanary/config"
	"github.com/imcanary/imcanary/probe/jsonws"
	"github.com/imcanary/imcanary/protocols"
)

// runJSONWS is imcanary jsonws try: a mapping walked step by step against
// the real server, every frame and matched rule printed.
func runJSONWS(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("jsonws", stdout, stderr)
	users := fs.String("users", "imcanary-try-a,imcanary-try-b", "the two users to log in: the first sends, the second receives")
	timeout := fs.Duration("timeout", 30*time.Second, "how long the whole walk may take")
	cfgFile, logLevel, logFormat := commonFlags(fs, config.CommandJSONWS)
	switch {
	case len(args) > 0 && (args[0] == "-h" || args[0] == "--help"):
		fs.Usage()
		return pflag.ErrHelp
	case len(args) == 0:
		return usageError{errors.New("want: jsonws try --config FILE")}
	case args[0] != "try":
		return usageError{fmt.Errorf("unknown jsonws command %q: want: jsonws try --config FILE", args[0])}
	}
	args = args[1:]
	if err := parseFlags(fs, "jsonws", args); err != nil {
		return usageError{err}
	}
	if err := noArgs(fs, args); err != nil {
		return usageError{err}
	}
	a, b, ok := strings.Cut(*users, ",")
	if !ok || a == "" || b == "" || a == b || strings.Contains(b, ",") {
		return usageError{fmt.Errorf("--users %q: want two different names, A,B", *users)}
	}
	log, err := newLogger(stderr, *logLevel, *logFormat)
	if err != nil {
		return err
	}
	cfg, err := protocols.Loader().Load(*cfgFile, os.Environ(), fs)
	if err != nil {
		return badConfig(err)
	}
	if cfg.Target.Protocol != "jsonws" {
		return badConfig(jsonws.ErrNotJSONWS)
	}
	t, err := protocols.Open(cfg, []int{2}, log)
	if err != nil {
		return badConfig(err)
	}
	defer t.Close()
	fmt.Fprintf(stdout, "walking the mapping of %s against %s\n", *cfgFile, cfg.Target.URL)
	if err := jsonws.Try(ctx, t.Driver.(*jsonws.Driver), a, b, *timeout, stdout); err != nil {
		fmt.Fprintf(stdout, "\nFAILED: %v\n", err)
		return errFailed
	}
	return nil
}
