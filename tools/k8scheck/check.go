// Package k8scheck keeps the Kubernetes manifests of docs/kubernetes.md
// honest without a cluster: every ```yaml block is decoded strictly against
// the API types of k8s.io/api (an unknown or misspelt field fails, as
// `kubectl apply --validate=strict` would), the recipe's rules are checked
// on each Pod (Recipe), and the test runs the sidecar's command and probes
// with the real udskit binary, as the manifest's users and groups.
//
// It is its own Go module so that k8s.io/api stays out of udskit's go.mod;
// `make k8scheck` (part of `make test`) runs it.
package k8scheck

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"path"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// Block is one ```yaml block of a Markdown file.
type Block struct {
	Line int // of the block's first line of YAML
	Text []byte
}

// Extract returns the ```yaml blocks of md.
func Extract(md []byte) []Block {
	var out []Block
	var cur *Block
	sc := bufio.NewScanner(bytes.NewReader(md))
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		switch {
		case cur == nil && strings.TrimSpace(line) == "```yaml":
			cur = &Block{Line: n + 1}
		case cur != nil && strings.TrimSpace(line) == "```":
			out = append(out, *cur)
			cur = nil
		case cur != nil:
			cur.Text = append(append(cur.Text, line...), '\n')
		}
	}
	return out
}

// DecodePod decodes one YAML document as a v1 Pod, strictly: a field the
// API does not have, a duplicate field or a wrong type fails.
func DecodePod(doc []byte) (*corev1.Pod, error) {
	var p corev1.Pod
	if err := yaml.UnmarshalStrict(doc, &p); err != nil {
		return nil, err
	}
	if p.APIVersion != "v1" || p.Kind != "Pod" {
		return nil, fmt.Errorf("apiVersion %q kind %q: want v1 Pod", p.APIVersion, p.Kind)
	}
	return &p, nil
}

// Sidecar is what Recipe found out about a pod's udskit sidecar.
type Sidecar struct {
	Container    *corev1.Container
	Native       bool   // an init container with restartPolicy: Always
	Socket       string // the socket path it serves
	MountPath    string // where the shared in-memory volume is mounted
	App          *corev1.Container
	DrainTimeout time.Duration
	MinGrace     time.Duration
	FSGroup      int64
}

// Recipe checks the rules of docs/kubernetes.md on p and returns what it
// found, or every rule that p breaks.
func Recipe(p *corev1.Pod) (*Sidecar, error) {
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	s := &Sidecar{}
	spec := &p.Spec

	// The shared volume: an in-memory emptyDir.
	vol := ""
	for _, v := range spec.Volumes {
		if v.EmptyDir != nil && v.EmptyDir.Medium == corev1.StorageMediumMemory {
			vol = v.Name
			if v.EmptyDir.SizeLimit == nil {
				bad("volume %s: give the emptyDir a sizeLimit (it is memory)", v.Name)
			}
		}
	}
	if vol == "" {
		return nil, errors.New("no emptyDir volume with medium: Memory for the socket")
	}

	// The sidecar: the container running udskit serve or proxy.
	for i := range spec.InitContainers {
		if isUdskit(&spec.InitContainers[i]) {
			s.Container, s.Native = &spec.InitContainers[i], true
		}
	}
	for i := range spec.Containers {
		c := &spec.Containers[i]
		if isUdskit(c) {
			if s.Container != nil {
				bad("two udskit sidecars")
			}
			s.Container = c
			if i != 0 {
				bad("container %s: list the sidecar first, so the kubelet starts it (and waits for its postStart) before the app", c.Name)
			}
		} else if s.App == nil {
			s.App = c
		}
	}
	if s.Container == nil {
		return nil, errors.New("no udskit sidecar (a container whose command is udskit serve or proxy)")
	}
	if s.App == nil {
		return nil, errors.New("no app container")
	}
	side := s.Container
	s.MountPath = mountOf(side, vol)
	if s.MountPath == "" {
		bad("sidecar %s does not mount %s", side.Name, vol)
	}
	if m := mountOf(s.App, vol); m != s.MountPath {
		bad("app %s mounts %s at %q, the sidecar at %q: mount it at the same path", s.App.Name, vol, m, s.MountPath)
	}

	args := argMap(side.Args[1:])
	switch side.Args[0] {
	case "serve":
		s.Socket = args[""]
	case "proxy":
		s.Socket = args["--listen"]
	}
	if s.Socket == "" || path.Dir(s.Socket) != s.MountPath {
		bad("sidecar socket %q is not in the shared volume %q", s.Socket, s.MountPath)
	}
	if env := envOf(s.App, "UDSKIT_SOCKET"); env != s.Socket {
		bad("app %s: UDSKIT_SOCKET=%q, the sidecar serves %q", s.App.Name, env, s.Socket)
	}

	// Draining: linger, within the pod's grace period.
	if args["--drain"] != "linger" {
		bad("sidecar: --drain=linger (the app still calls during its own shutdown)")
	}
	var err error
	if s.DrainTimeout, err = time.ParseDuration(args["--drain-timeout"]); err != nil {
		bad("sidecar: --drain-timeout: %v", err)
	}
	if g := args["--drain-min-grace"]; g != "" {
		if s.MinGrace, err = time.ParseDuration(g); err != nil {
			bad("sidecar: --drain-min-grace: %v", err)
		}
	}
	grace := int64(corev1.DefaultTerminationGracePeriodSeconds)
	if spec.TerminationGracePeriodSeconds != nil {
		grace = *spec.TerminationGracePeriodSeconds
	}
	if s.DrainTimeout+time.Second > time.Duration(grace)*time.Second {
		bad("--drain-timeout %v must end at least 1s before terminationGracePeriodSeconds %d (then the kubelet kills)", s.DrainTimeout, grace)
	}

	// Start-up order.
	if s.Native {
		if side.RestartPolicy == nil || *side.RestartPolicy != corev1.ContainerRestartPolicyAlways {
			bad("init container %s: restartPolicy: Always makes it a native sidecar", side.Name)
		}
		if side.StartupProbe == nil || !isHealth(side.StartupProbe.Exec, s.Socket, false) {
			bad("native sidecar %s: a startupProbe running udskit health on %s (the app starts once it passes)", side.Name, s.Socket)
		}
	} else if side.Lifecycle == nil || side.Lifecycle.PostStart == nil || !isHealth(side.Lifecycle.PostStart.Exec, s.Socket, true) {
		bad("sidecar %s: a postStart hook running udskit health --wait on %s (the kubelet starts the app after it returns)", side.Name, s.Socket)
	}
	for what, pr := range map[string]*corev1.Probe{"readinessProbe": side.ReadinessProbe, "livenessProbe": side.LivenessProbe} {
		if pr == nil || !isHealth(pr.Exec, s.Socket, false) {
			bad("sidecar %s: a %s running udskit health on %s", side.Name, what, s.Socket)
		}
	}

	// Users: different uids, a shared group, a socket mode and --allow-uid
	// that let exactly the app (and the sidecar's own probes) in.
	psc := spec.SecurityContext
	if psc == nil || psc.FSGroup == nil {
		bad("pod: securityContext.fsGroup (the socket's group)")
	} else {
		s.FSGroup = *psc.FSGroup
	}
	if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot {
		bad("pod: securityContext.runAsNonRoot: true")
	}
	su, au := uidOf(side), uidOf(s.App)
	if su < 0 || au < 0 {
		bad("give both containers a securityContext.runAsUser")
	}
	for _, c := range []*corev1.Container{side, s.App} {
		if sc := c.SecurityContext; sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
			bad("container %s: allowPrivilegeEscalation: false", c.Name)
		}
	}
	if su != au {
		mode, err := strconv.ParseUint(args["--mode"], 8, 32)
		if err != nil || mode&0o060 != 0o060 || mode&0o007 != 0 {
			bad("sidecar: --mode %q: the app runs as another uid: give the group (fsGroup) read-write, others nothing (0660)", args["--mode"])
		}
	}
	allowed := map[string]bool{}
	for _, u := range strings.Split(args["--allow-uid"], ",") {
		allowed[u] = true
	}
	if args["--allow-uid"] != "" && (!allowed[strconv.FormatInt(au, 10)] || !allowed[strconv.FormatInt(su, 10)]) {
		bad("sidecar: --allow-uid %q must name the app's uid %d and its own %d (its probes run as it)", args["--allow-uid"], au, su)
	}

	// Resources.
	r := side.Resources
	if r.Requests.Cpu().IsZero() || r.Requests.Memory().IsZero() || r.Limits.Memory().IsZero() {
		bad("sidecar %s: resources: requests cpu and memory, limits memory", side.Name)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return s, nil
}

func isUdskit(c *corev1.Container) bool {
	return len(c.Command) == 1 && path.Base(c.Command[0]) == "udskit" && len(c.Args) > 0 &&
		(c.Args[0] == "serve" || c.Args[0] == "proxy")
}

func mountOf(c *corev1.Container, vol string) string {
	for _, m := range c.VolumeMounts {
		if m.Name == vol {
			return m.MountPath
		}
	}
	return ""
}

func envOf(c *corev1.Container, name string) string {
	for _, e := range c.Env {
		if e.Name == name {
			return e.Value
		}
	}
	return ""
}

func uidOf(c *corev1.Container) int64 {
	if c.SecurityContext == nil || c.SecurityContext.RunAsUser == nil {
		return -1
	}
	return *c.SecurityContext.RunAsUser
}

// argMap maps --flag=value (and --flag value) to value; the positional
// argument is under "".
func argMap(args []string) map[string]string {
	m := map[string]string{}
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case strings.HasPrefix(a, "--") && strings.Contains(a, "="):
			k, v, _ := strings.Cut(a, "=")
			m[k] = v
		case strings.HasPrefix(a, "-"):
			if i+1 < len(args) && !strings.HasPrefix(args[i+1], "-") {
				m[a] = args[i+1]
				i++
			} else {
				m[a] = "true"
			}
		default:
			m[""] = a
		}
	}
	return m
}

// isHealth reports whether e runs `udskit health` on socket (with --wait
// when wait).
func isHealth(e *corev1.ExecAction, socket string, wait bool) bool {
	if e == nil || len(e.Command) < 3 || path.Base(e.Command[0]) != "udskit" || e.Command[1] != "health" {
		return false
	}
	if e.Command[len(e.Command)-1] != socket {
		return false
	}
	hasWait := false
	for _, a := range e.Command {
		hasWait = hasWait || a == "--wait"
	}
	return hasWait == wait
}
