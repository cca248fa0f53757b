package main

import (
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/imcanary/imcanary/config"
	"github.com/imcanary/imcanary/protocols"
)

// newFlags returns the flag set of the command named name. --help and -h
// print the command's help on stdout, where a pager or grep can read it,
// and Parse then returns pflag.ErrHelp; parse errors are returned, never
// printed with the whole help after them.
func newFlags(name string, stdout, stderr io.Writer) *pflag.FlagSet {
	fs := pflag.NewFlagSet("imcanary "+name, pflag.ContinueOnError)
	fs.SetOutput(stderr) // pflag's own notices, such as a deprecation
	fs.Usage = func() { printHelp(stdout, name, fs) }
	return fs
}

// printHelp writes the help of the command named name: its synopsis, what
// it does, its own flags, the configuration keys it takes and the
// environment variables it reads besides.
func printHelp(w io.Writer, name string, fs *pflag.FlagSet) {
	c, _ := lookup(name)
	fmt.Fprintf(w, "Usage: %s\n\n%s\n", c.synopsis, c.about)
	own := pflag.NewFlagSet(name, pflag.ContinueOnError)
	keys := pflag.NewFlagSet(name, pflag.ContinueOnError)
	fs.VisitAll(func(f *pflag.Flag) {
		if protocols.Loader().EnvName(f.Name) != "" {
			keys.AddFlag(f)
		} else {
			own.AddFlag(f)
		}
	})
	own.BoolP("help", "h", false, "print this help")
	fmt.Fprintf(w, "\nFlags:\n%s", own.FlagUsagesWrapped(helpWidth))
	if keys.HasFlags() {
		fmt.Fprintf(w, "\nConfiguration keys this command uses (each also IMCANARY_KEY in the environment and KEY in\n"+
			"the --config file; a flag wins over the environment, which wins over the file):\n%s",
			keys.FlagUsagesWrapped(helpWidth))
	}
	printEnv(w, name)
}

// parseFlags parses args into fs, the flag set of the command named name,
// and says what is wrong with them in words (see flagError).
func parseFlags(fs *pflag.FlagSet, name string, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return err
		}
		return flagError(fs, name, err)
	}
	return nil
}

// typeReasons say what a flag of each pflag type must be, in the words the
// configuration's own errors use, rather than strconv's "invalid syntax".
var typeReasons = map[string]string{
	"bool":     "must be true or false",
	"int":      "must be a whole number",
	"int64":    "must be a whole number",
	"uint":     "must be a whole number, not negative",
	"float64":  "must be a number",
	"duration": `must be a duration with a unit, such as "500ms", "10s" or "1m30s"`,
}

// flagError rewrites an error of fs.Parse for a person: a bad value names
// the flag, the value and what it must be ("--timeout: "abc": must be a
// duration..."); an unknown flag gets the closest one of the command, or,
// if it is a configuration key the command does not use, says so.
func flagError(fs *pflag.FlagSet, name string, err error) error {
	if iv, ok := errors.AsType[*pflag.InvalidValueError](err); ok {
		f := iv.GetFlag()
		reason, known := typeReasons[f.Value.Type()]
		switch {
		case errors.Is(err, strconv.ErrRange):
			reason = "is out of range"
		case !known:
			reason = iv.Unwrap().Error()
		}
		return fmt.Errorf("--%s: %q: %s", f.Name, iv.GetValue(), reason)
	}
	if ne, ok := errors.AsType[*pflag.NotExistError](err); ok && ne.GetSpecifiedShortnames() == "" {
		flag := ne.GetSpecifiedName()
		if protocols.Loader().EnvName(flag) != "" {
			return fmt.Errorf("%w: imcanary %s does not use %s", err, name, flag)
		}
		var names []string
		fs.VisitAll(func(f *pflag.Flag) { names = append(names, f.Name) })
		if near := config.Closest(flag, append(names, "help")); near != "" {
			return fmt.Errorf("%w: did you mean %q?", err, "--"+near)
		}
	}
	return err
}

// noArgs refuses the arguments left after the flags, for a command that
// takes none. "--key false" is the likely mistake: a boolean flag given
// alone is true, so the value became an argument.
func noArgs(fs *pflag.FlagSet, args []string) error {
	if fs.NArg() == 0 {
		return nil
	}
	arg := fs.Arg(0)
	err := fmt.Errorf("unexpected argument %q", arg)
	for i, a := range args {
		if a != arg || i == 0 {
			continue
		}
		prev, ok := strings.CutPrefix(args[i-1], "--")
		if f := fs.Lookup(prev); ok && f != nil && f.NoOptDefVal != "" {
			return fmt.Errorf("%w: write --%s=%s, as a boolean flag given alone is true", err, prev, arg)
		}
		break
	}
	return err
}

// pushFlags registers --push.gateway and --push.timeout, for the one-shot
// commands that a CI pipeline runs where nothing scrapes them.
func pushFlags(fs *pflag.FlagSet, job string) *pushOptions {
	o := &pushOptions{}
	fs.StringVar(&o.gateway, "push.gateway", "", "push the final metrics to this Prometheus Pushgateway (http://HOST:PORT) as job "+
		job+"; exit 3 if the push fails and the verdict passed")
	fs.DurationVar(&o.timeout, "push.timeout", 10*time.Second, "how long the push to --push.gateway may take")
	return o
}
