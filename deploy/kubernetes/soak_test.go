package kubernetes

import (
	"fmt"
	"os"
	"path"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/imcanary/imcanary/config"
	"github.com/imcanary/imcanary/protocols"
)

// The release soak test's manifests, in soak/: created per run, never by
// kubectl apply -k of this directory.
const (
	soakDir       = "soak"
	indexAnnot    = "metadata.annotations['batch.kubernetes.io/job-completion-index']"
	startVar      = "SOAK_START_AT"
	reportsVolume = "reports"
)

// soakManifests are soak/'s objects, each file holding one.
type soakManifests struct {
	shards, merge *batchv1.Job
	reports       *corev1.PersistentVolumeClaim
}

func loadSoak(t *testing.T) soakManifests {
	t.Helper()
	var m soakManifests
	for file, into := range map[string]any{"job.yaml": &m.shards, "merge-job.yaml": &m.merge, "reports-pvc.yaml": &m.reports} {
		b, err := os.ReadFile(filepath.Join(soakDir, file))
		if err != nil {
			t.Fatal(err)
		}
		docs, _ := splitDocuments(b)
		if len(docs) != 1 {
			t.Fatalf("%s/%s: %d documents, want 1", soakDir, file, len(docs))
		}
		obj, err := decode(docs[0])
		if err != nil {
			t.Fatalf("%s/%s: %v", soakDir, file, err)
		}
		v := reflect.ValueOf(into).Elem()
		if !reflect.TypeOf(obj).AssignableTo(v.Type()) {
			t.Fatalf("%s/%s is a %T, want a %v", soakDir, file, obj, v.Type())
		}
		v.Set(reflect.ValueOf(obj))
	}
	return m
}

// soakFlags is the flag set of imcanary soak: the configuration keys of the
// soak command and the command's own flags, kept in step with
// cmd/imcanary/oneshot.go by hand.
func soakFlags() *pflag.FlagSet {
	fs := pflag.NewFlagSet("imcanary soak", pflag.ContinueOnError)
	for _, f := range []string{"config", "profile", "json", "html", "start_at", "push.gateway"} {
		fs.String(f, "", "")
	}
	fs.Duration("push.timeout", 10*time.Second, "")
	fs.String("log.level", "info", "")
	fs.String("log.format", "text", "")
	protocols.Loader().RegisterCommandFlags(fs, config.CommandSoak)
	return fs
}

// expand does what the kubelet does to a container's args: $(VAR) is the
// value of an earlier variable of its env, here vars.
func expand(args []string, vars map[string]string) []string {
	out := make([]string, len(args))
	for i, a := range args {
		for k, v := range vars {
			a = strings.ReplaceAll(a, "$("+k+")", v)
		}
		out[i] = a
	}
	return out
}

// envValue is the literal value of the variable name in c's env, and
// whether it has one.
func envValue(c corev1.Container, name string) (string, bool) {
	for _, e := range c.Env {
		if e.Name == name && e.ValueFrom == nil {
			return e.Value, true
		}
	}
	return "", false
}

// TestSoakJob checks soak/: an Indexed Job of N shards of one run, each
// shard from its completion index, all with one start time, writing their
// reports into one directory of a volume that the merge Job reads; the
// same image, configuration, secret and security as the StatefulSet; and
// a profile that the ConfigMap's configuration has, loaded by imcanary's
// own loader with each shard's arguments.
func TestSoakJob(t *testing.T) {
	base := load(t)
	sts, cm := base.statefulSets[0], base.configMaps[0]
	stsPod := sts.Spec.Template.Spec
	m := loadSoak(t)
	job, merge := m.shards, m.merge

	if job.Spec.CompletionMode == nil || *job.Spec.CompletionMode != batchv1.IndexedCompletion {
		t.Errorf("job.yaml completionMode %s, want Indexed: a shard is its completion index", show(job.Spec.CompletionMode))
	}
	if job.Spec.Completions == nil || job.Spec.Parallelism == nil || *job.Spec.Completions != *job.Spec.Parallelism {
		t.Fatalf("job.yaml completions %s, parallelism %s: want equal, every shard at once", show(job.Spec.Completions), show(job.Spec.Parallelism))
	}
	n := int(*job.Spec.Completions)
	for name, j := range map[string]*batchv1.Job{"job.yaml": job, "merge-job.yaml": merge} {
		if j.Spec.BackoffLimit == nil || *j.Spec.BackoffLimit != 0 {
			t.Errorf("%s backoffLimit %s, want 0: a shard run again starts late, a verdict is not retried", name, show(j.Spec.BackoffLimit))
		}
		pod := j.Spec.Template.Spec
		if pod.RestartPolicy != corev1.RestartPolicyNever {
			t.Errorf("%s restartPolicy %q, want Never", name, pod.RestartPolicy)
		}
		if j.GenerateName == "" || j.Name != "" {
			t.Errorf("%s name %q generateName %q: want a generated name, a Job per run", name, j.Name, j.GenerateName)
		}
		if len(pod.Containers) != 1 {
			t.Fatalf("%s has %d containers, want 1", name, len(pod.Containers))
		}
		c, sc := pod.Containers[0], stsPod.Containers[0]
		if c.Image != sc.Image {
			t.Errorf("%s image %q, want the StatefulSet's %q", name, c.Image, sc.Image)
		}
		if !reflect.DeepEqual(pod.SecurityContext, stsPod.SecurityContext) || !reflect.DeepEqual(c.SecurityContext, sc.SecurityContext) {
			t.Errorf("%s security contexts differ from the StatefulSet's (checked in TestManifests)", name)
		}
		for what, b := range map[string]*bool{"automountServiceAccountToken": pod.AutomountServiceAccountToken, "enableServiceLinks": pod.EnableServiceLinks} {
			if b == nil || *b {
				t.Errorf("%s %s = %s, want false", name, what, show(b))
			}
		}
		i := slices.IndexFunc(pod.Volumes, func(v corev1.Volume) bool { return v.Name == reportsVolume })
		if i < 0 || pod.Volumes[i].PersistentVolumeClaim == nil || pod.Volumes[i].PersistentVolumeClaim.ClaimName != m.reports.Name {
			t.Errorf("%s: no volume %q of the claim %s", name, reportsVolume, m.reports.Name)
		}
	}
	if !slices.Contains(m.reports.Spec.AccessModes, corev1.ReadWriteMany) {
		t.Errorf("reports-pvc.yaml access modes %v: want ReadWriteMany, for pods on several nodes", m.reports.Spec.AccessModes)
	}

	c := job.Spec.Template.Spec.Containers[0]
	start, ok := envValue(c, startVar)
	mergeStart, mok := envValue(merge.Spec.Template.Spec.Containers[0], startVar)
	if !ok || !mok || start != mergeStart {
		t.Fatalf("%s: job.yaml %q, merge-job.yaml %q; want one literal value in both, the run's", startVar, start, mergeStart)
	}
	if _, err := time.Parse(time.RFC3339, start); err != nil {
		t.Errorf("%s %q: %v", startVar, start, err)
	}
	var indexVar string
	for _, e := range c.Env {
		if e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == indexAnnot {
			indexVar = e.Name
		}
	}
	if indexVar == "" {
		t.Fatalf("job.yaml: no variable from %s", indexAnnot)
	}
	if len(c.Args) == 0 || c.Args[0] != "soak" {
		t.Fatalf("job.yaml args %q, want soak ...", c.Args)
	}

	// Each shard's arguments, as its pod gets them, through imcanary's
	// own loader on the ConfigMap's configuration.
	file := filepath.Join(t.TempDir(), configKey)
	if err := os.WriteFile(file, []byte(cm.Data[configKey]), 0o600); err != nil {
		t.Fatal(err)
	}
	stand := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(stand, []byte("stand-in for the cluster's Secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var dirs []string
	for i := range n {
		args := expand(c.Args[1:], map[string]string{startVar: start, indexVar: fmt.Sprint(i)})
		fs := soakFlags()
		if err := fs.Parse(args); err != nil || fs.NArg() > 0 {
			t.Fatalf("shard %d's args %q: %v %q", i, args, err, fs.Args())
		}
		cfgPath, _ := fs.GetString("config")
		if f, _, ok := fileAt(job.Spec.Template.Spec, c, cfgPath); !ok || f != (volumeFile{"configMap", cm.Name, configKey}) {
			t.Fatalf("--config=%s is %+v, want key %s of ConfigMap %s", cfgPath, f, configKey, cm.Name)
		}
		if at, _ := fs.GetString("start_at"); at != start {
			t.Errorf("shard %d: --start_at=%q, want %s's %q", i, at, startVar, start)
		}
		env := []string{secretFileEnv + "=" + stand}
		cfg, err := protocols.Loader().Load(file, env, fs)
		if err != nil {
			t.Fatalf("shard %d: the ConfigMap's configuration with its args: %v", i, err)
		}
		sh, err := config.ParseShard(cfg.Shard, "")
		if err != nil || sh.Index != i || sh.Count != n {
			t.Errorf("shard %d: shard %q (%v), want %d/%d, N the completions", i, cfg.Shard, err, i, n)
		}
		if !cfg.Population.AcrossShards {
			// One release test of one population: its groups span
			// the shards, as the users of one server's do.
			t.Errorf("shard %d: population.across_shards false, want the profile's users laid out across the Job's shards", i)
		}
		profile, _ := fs.GetString("profile")
		if p, ok := cfg.Profile(profile); !ok || p.Schedule != "" {
			t.Errorf("shard %d: profile %q: in the configuration %v, schedule %q; want one there, run on demand only", i, profile, ok, p.Schedule)
		}
		if v := slices.IndexFunc(c.VolumeMounts, func(vm corev1.VolumeMount) bool { return vm.MountPath == cfg.DataDir && !vm.ReadOnly }); v < 0 {
			t.Errorf("shard %d: data_dir %s is not a writable mount", i, cfg.DataDir)
		}
		js, _ := fs.GetString("json")
		if !strings.HasPrefix(js, "/"+reportsVolume+"/") {
			t.Errorf("shard %d: --json=%s, not on the reports volume", i, js)
		}
		dirs = append(dirs, path.Dir(js))
		if strings.Contains(js, "$(") {
			t.Errorf("shard %d: --json=%s names a variable its env lacks", i, js)
		}
	}
	if len(slices.Compact(slices.Clone(dirs))) != 1 {
		t.Errorf("the shards write their reports into %q, want one directory of the run", dirs)
	}

	// The merge reads that directory, and writes beside it, not in it,
	// where a second merge would read its own output.
	mc := merge.Spec.Template.Spec.Containers[0]
	margs := expand(mc.Args, map[string]string{startVar: start})
	if len(margs) < 3 || margs[0] != "soak" || margs[1] != "merge" || margs[len(margs)-1] != dirs[0] {
		t.Fatalf("merge-job.yaml args %q, want soak merge ... %s", margs, dirs[0])
	}
	for _, a := range margs[2 : len(margs)-1] {
		if _, out, ok := strings.Cut(a, "="); ok && path.Dir(out) == dirs[0] {
			t.Errorf("merge-job.yaml writes %s into the run's directory, which a later merge would read", out)
		}
	}
}

// TestSoakREADME: README.md says how to run the release soak test.
func TestSoakREADME(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	files, _ := filepath.Glob(filepath.Join(soakDir, "*.yaml"))
	for _, f := range files {
		if !strings.Contains(string(readme), f) {
			t.Errorf("README.md does not mention %s", f)
		}
	}
	for _, want := range []string{startVar, "kubectl -n imcanary create -f -", "soak merge"} {
		if !strings.Contains(string(readme), want) {
			t.Errorf("README.md does not say %q", want)
		}
	}
}
