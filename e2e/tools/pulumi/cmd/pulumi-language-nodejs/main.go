// Command pulumi-language-nodejs is a STAND-IN for Pulumi's Node.js language host, used by the
// e2e tests and the local demo only; the operator's image ships Pulumi's own host.
//
// Pulumi's own host lives in a module of its own
// (github.com/pulumi/pulumi/sdk/nodejs/cmd/pulumi-language-nodejs/v3) that the Go module proxy
// reachable here refuses at every version, so this is a small host of ours, written against the
// gRPC contract of the pinned SDK (pulumirpc.LanguageRuntimeServer). It covers what `pulumi up/preview/refresh/destroy`
// need for a JavaScript or TypeScript program:
//
//   - Run: starts `node [nodeargs] <@pulumi/pulumi/cmd/run> --monitor=... <entry point>` in the
//     program directory, resolving the run script from the program's own node_modules, with the
//     stack configuration in PULUMI_CONFIG / PULUMI_CONFIG_SECRET_KEYS;
//   - GetRequiredPackages / GetRequiredPlugins: the resource plugins that installed npm
//     packages declare (package.json "pulumi" block or pulumi-plugin.json);
//   - InstallDependencies: `npm install` (or the packagemanager runtime option);
//   - Handshake and GetPluginInfo.
//
// Everything else (policy packs through RunPlugin, code generation, `pulumi about` details)
// answers Unimplemented, which the engine reports or falls back from.
//
// The host, and the program it runs, stop when the engine goes away (its parent changes, or the
// engine's gRPC endpoint stops answering), so a `pulumi` killed with SIGKILL leaves no host behind.
//
// Runtime options read from Pulumi.yaml: typescript (default true), tsconfig, nodeargs,
// packagemanager.
package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/pulumi/pulumi/sdk/v3/go/common/util/rpcutil"
	"github.com/pulumi/pulumi/sdk/v3/go/common/version"
	pulumirpc "github.com/pulumi/pulumi/sdk/v3/proto/go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"
)

// exitLoggedError is the exit code @pulumi/pulumi's run script uses after it has already shown
// the user an actionable error: the engine should stop without adding a message of its own.
const exitLoggedError = 32

func main() {
	engine := engineAddress(os.Args[1:])

	// Everything stops when the engine goes away: when our parent changes (the engine was killed
	// and we were re-parented) or, as Pulumi's own hosts do, when the engine stops answering.
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	go watchParent(ctx, stop)
	if engine != "" {
		if err := rpcutil.Healthcheck(ctx, engine, 10*time.Second, stop); err != nil {
			fmt.Fprintf(os.Stderr, "pulumi-language-nodejs: %v\n", err)
			os.Exit(1)
		}
	}
	cancel := make(chan bool)
	go func() {
		<-ctx.Done()
		close(cancel)
	}()

	h := &host{engine: engine, alive: ctx}
	handle, err := rpcutil.ServeWithOptions(rpcutil.ServeOptions{
		Init: func(s *grpc.Server) error {
			pulumirpc.RegisterLanguageRuntimeServer(s, h)
			return nil
		},
		Cancel: cancel,
	})
	if err != nil {
		fmt.Fprintf(os.Stderr, "pulumi-language-nodejs: %v\n", err)
		os.Exit(1)
	}
	// The engine reads the port from the first line of stdout.
	fmt.Printf("%d\n", handle.Port)
	if err := <-handle.Done; err != nil {
		fmt.Fprintf(os.Stderr, "pulumi-language-nodejs: %v\n", err)
		os.Exit(1)
	}
}

// watchParent calls stop once this process has a different parent than it started with.
func watchParent(ctx context.Context, stop context.CancelFunc) {
	parent := os.Getppid()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			if os.Getppid() != parent {
				stop()
				return
			}
		}
	}
}

// engineAddress returns the last positional argument: the engine passes logging and tracing
// flags first (`--logtostderr`, `-v=N`, `--tracing URL`) and its own address last.
func engineAddress(args []string) string {
	var positional []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "--tracing" || a == "-tracing" || a == "--root" || a == "-root":
			i++ // flag with a separate value
		case strings.HasPrefix(a, "-"):
		default:
			positional = append(positional, a)
		}
	}
	if len(positional) == 0 {
		return ""
	}
	return positional[len(positional)-1]
}

type host struct {
	pulumirpc.UnimplementedLanguageRuntimeServer

	alive context.Context // done when the engine is gone

	mu     sync.Mutex
	engine string
}

func (h *host) engineAddr() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.engine
}

func (h *host) Handshake(
	_ context.Context, req *pulumirpc.LanguageHandshakeRequest,
) (*pulumirpc.LanguageHandshakeResponse, error) {
	if req.GetEngineAddress() != "" {
		h.mu.Lock()
		h.engine = req.GetEngineAddress()
		h.mu.Unlock()
	}
	return &pulumirpc.LanguageHandshakeResponse{}, nil
}

func (h *host) GetPluginInfo(context.Context, *emptypb.Empty) (*pulumirpc.PluginInfo, error) {
	return &pulumirpc.PluginInfo{Version: strings.TrimPrefix(version.Version, "v")}, nil
}

// options are the runtime options of Pulumi.yaml (`runtime: {name: nodejs, options: {...}}`).
type options struct {
	typescript     bool
	tsconfig       string
	nodeargs       []string
	packagemanager string
}

func readOptions(info *pulumirpc.ProgramInfo) options {
	o := options{typescript: true, packagemanager: "npm"}
	m := info.GetOptions().AsMap()
	if v, ok := m["typescript"].(bool); ok {
		o.typescript = v
	}
	if v, ok := m["tsconfig"].(string); ok {
		o.tsconfig = v
	}
	if v, ok := m["nodeargs"].(string); ok {
		o.nodeargs = strings.Fields(v)
	}
	if v, ok := m["packagemanager"].(string); ok && v != "" {
		o.packagemanager = v
	}
	return o
}

func (h *host) Run(ctx context.Context, req *pulumirpc.RunRequest) (*pulumirpc.RunResponse, error) {
	info := req.GetInfo()
	dir := info.GetProgramDirectory()
	if dir == "" {
		dir = req.GetPwd()
	}
	entry := info.GetEntryPoint()
	if entry == "" {
		entry = req.GetProgram()
	}
	if entry == "" {
		entry = "."
	}
	opts := readOptions(info)

	runScript, err := resolveFrom(ctx, dir, "@pulumi/pulumi/cmd/run")
	if err != nil {
		return &pulumirpc.RunResponse{Error: fmt.Sprintf(
			"cannot find @pulumi/pulumi in %s (run `npm install` there first): %v", dir, err)}, nil
	}

	args := append([]string{}, opts.nodeargs...)
	args = append(args, runScript, "--monitor="+req.GetMonitorAddress())
	if e := h.engineAddr(); e != "" {
		args = append(args, "--engine="+e)
	}
	args = append(args,
		"--project="+req.GetProject(),
		"--stack="+req.GetStack(),
		"--pwd="+dir,
	)
	if root := info.GetRootDirectory(); root != "" {
		args = append(args, "--root-directory="+root)
	}
	if org := req.GetOrganization(); org != "" {
		args = append(args, "--organization="+org)
	}
	if req.GetParallel() > 0 {
		args = append(args, fmt.Sprintf("--parallel=%d", req.GetParallel()))
	}
	if req.GetDryRun() {
		args = append(args, "--dry-run")
	}
	args = append(args, entry)
	args = append(args, req.GetArgs()...)

	config, err := json.Marshal(req.GetConfig())
	if err != nil {
		return nil, err
	}
	secretKeys := req.GetConfigSecretKeys()
	if secretKeys == nil {
		secretKeys = []string{}
	}
	secrets, err := json.Marshal(secretKeys)
	if err != nil {
		return nil, err
	}

	// Stop the program when the engine cancels the call or goes away.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(h.alive, cancel)()

	cmd := exec.CommandContext(ctx, "node", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(),
		"PULUMI_CONFIG="+string(config),
		"PULUMI_CONFIG_SECRET_KEYS="+string(secrets),
		fmt.Sprintf("PULUMI_NODEJS_TYPESCRIPT=%t", opts.typescript),
	)
	if opts.tsconfig != "" {
		cmd.Env = append(cmd.Env, "PULUMI_NODEJS_TSCONFIG_PATH="+opts.tsconfig)
	}
	// The engine shows whatever the program writes as its output.
	cmd.Stdout = os.Stdout
	cmd.Stderr = os.Stderr
	// On cancellation ask node to stop first; CommandContext kills it after WaitDelay.
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGINT) }
	cmd.WaitDelay = 10 * time.Second

	err = cmd.Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return &pulumirpc.RunResponse{}, nil
	case errors.As(err, &exit):
		if code := exit.ExitCode(); code == exitLoggedError {
			return &pulumirpc.RunResponse{Bail: true}, nil
		} else if code >= 0 {
			return &pulumirpc.RunResponse{Error: fmt.Sprintf("Program exited with non-zero exit code: %d", code)}, nil
		}
		return &pulumirpc.RunResponse{Error: fmt.Sprintf("Program was ended: %v", err)}, nil
	default:
		return &pulumirpc.RunResponse{Error: fmt.Sprintf("Could not start node: %v", err)}, nil
	}
}

// resolveFrom asks node where `require.resolve(module)` points when run from dir, which is how
// a program finds its own copy of @pulumi/pulumi.
func resolveFrom(ctx context.Context, dir, module string) (string, error) {
	cmd := exec.CommandContext(ctx, "node", "-e",
		"process.stdout.write(require.resolve(process.argv[1]))", module)
	cmd.Dir = dir
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		if msg := strings.TrimSpace(stderr.String()); msg != "" {
			first, _, _ := strings.Cut(msg, "\n")
			return "", fmt.Errorf("%w: %s", err, first)
		}
		return "", err
	}
	return string(out), nil
}

func (h *host) GetRequiredPackages(
	_ context.Context, req *pulumirpc.GetRequiredPackagesRequest,
) (*pulumirpc.GetRequiredPackagesResponse, error) {
	deps, err := pluginPackages(req.GetInfo().GetProgramDirectory())
	if err != nil {
		return nil, err
	}
	resp := &pulumirpc.GetRequiredPackagesResponse{}
	for _, d := range deps {
		resp.Packages = append(resp.Packages, d.proto())
	}
	return resp, nil
}

func (h *host) GetRequiredPlugins(
	_ context.Context, req *pulumirpc.GetRequiredPluginsRequest,
) (*pulumirpc.GetRequiredPluginsResponse, error) {
	dir := req.GetInfo().GetProgramDirectory()
	if dir == "" {
		dir = req.GetPwd()
	}
	deps, err := pluginPackages(dir)
	if err != nil {
		return nil, err
	}
	resp := &pulumirpc.GetRequiredPluginsResponse{}
	for _, d := range deps {
		if d.param != nil {
			continue // parameterized packages need GetRequiredPackages
		}
		resp.Plugins = append(resp.Plugins, &pulumirpc.PluginDependency{
			Name: d.name, Kind: "resource", Version: d.version, Server: d.server,
		})
	}
	return resp, nil
}

// pluginJSON is the part of pulumi-plugin.json, or of a package.json "pulumi" block, that names
// the resource plugin an npm package needs.
type pluginJSON struct {
	Resource         bool   `json:"resource"`
	Name             string `json:"name"`
	Version          string `json:"version"`
	Server           string `json:"server"`
	Parameterization *struct {
		Name    string `json:"name"`
		Version string `json:"version"`
		Value   string `json:"value"` // base64
	} `json:"parameterization"`
}

type pluginPackage struct {
	name, version, server string
	param                 *pulumirpc.PackageParameterization
}

func (p pluginPackage) proto() *pulumirpc.PackageDependency {
	return &pulumirpc.PackageDependency{
		Name: p.name, Kind: "resource", Version: p.version, Server: p.server,
		Parameterization: p.param,
	}
}

// pluginPackages walks the node_modules folder that serves dir (dir's own, or the nearest one
// above it, as with npm workspaces) and collects the resource plugins its packages declare.
func pluginPackages(dir string) ([]pluginPackage, error) {
	if dir == "" {
		return nil, nil
	}
	modules := ""
	for d := dir; ; d = filepath.Dir(d) {
		if st, err := os.Stat(filepath.Join(d, "node_modules")); err == nil && st.IsDir() {
			modules = filepath.Join(d, "node_modules")
			break
		}
		if filepath.Dir(d) == d {
			return nil, nil
		}
	}
	found := map[string]pluginPackage{}
	if err := scanModules(modules, found, 0); err != nil {
		return nil, err
	}
	out := make([]pluginPackage, 0, len(found))
	for _, p := range found {
		out = append(out, p)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].name != out[j].name {
			return out[i].name < out[j].name
		}
		return out[i].version < out[j].version
	})
	return out, nil
}

func scanModules(modules string, found map[string]pluginPackage, depth int) error {
	if depth > 16 {
		return nil
	}
	entries, err := os.ReadDir(modules)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return err
	}
	for _, e := range entries {
		name := e.Name()
		if strings.HasPrefix(name, ".") {
			continue
		}
		path := filepath.Join(modules, name)
		if strings.HasPrefix(name, "@") {
			if err := scanModules(path, found, depth); err != nil {
				return err
			}
			continue
		}
		if st, err := os.Stat(path); err != nil || !st.IsDir() {
			continue
		}
		if p, ok := readPluginPackage(path); ok {
			key := p.name + "@" + p.version
			if p.param != nil {
				key += "/" + p.param.Name + "@" + p.param.Version
			}
			found[key] = p
		}
		if err := scanModules(filepath.Join(path, "node_modules"), found, depth+1); err != nil {
			return err
		}
	}
	return nil
}

func readPluginPackage(dir string) (pluginPackage, bool) {
	var pkg struct {
		Name    string      `json:"name"`
		Version string      `json:"version"`
		Pulumi  *pluginJSON `json:"pulumi"`
	}
	if raw, err := os.ReadFile(filepath.Join(dir, "package.json")); err == nil {
		_ = json.Unmarshal(raw, &pkg)
	}
	meta := pkg.Pulumi
	if raw, err := os.ReadFile(filepath.Join(dir, "pulumi-plugin.json")); err == nil {
		var p pluginJSON
		if json.Unmarshal(raw, &p) == nil {
			meta = &p
		}
	}
	if meta == nil || !meta.Resource {
		return pluginPackage{}, false
	}
	p := pluginPackage{name: meta.Name, version: meta.Version, server: meta.Server}
	if p.name == "" {
		// "@pulumi/kubernetes" -> "kubernetes"
		p.name = strings.TrimPrefix(pkg.Name, "@pulumi/")
	}
	if p.version == "" {
		p.version = pkg.Version
	}
	if p.name == "" {
		return pluginPackage{}, false
	}
	if meta.Parameterization != nil {
		value, err := base64.StdEncoding.DecodeString(meta.Parameterization.Value)
		if err != nil {
			return pluginPackage{}, false
		}
		p.param = &pulumirpc.PackageParameterization{
			Name: meta.Parameterization.Name, Version: meta.Parameterization.Version, Value: value,
		}
	}
	return p, true
}

// InstallDependencies runs the package manager's install in the program directory and streams
// its output back to the engine.
func (h *host) InstallDependencies(
	req *pulumirpc.InstallDependenciesRequest,
	stream grpc.ServerStreamingServer[pulumirpc.InstallDependenciesResponse],
) error {
	dir := req.GetInfo().GetProgramDirectory()
	if dir == "" {
		dir = req.GetDirectory()
	}
	pm := readOptions(req.GetInfo()).packagemanager
	switch pm {
	case "npm", "yarn", "pnpm", "bun":
	default:
		return status.Errorf(codes.InvalidArgument, "unknown packagemanager %q", pm)
	}
	cmd := exec.CommandContext(stream.Context(), pm, "install")
	cmd.Dir = dir
	var mu sync.Mutex
	send := func(stdout bool) io.Writer {
		return writerFunc(func(b []byte) (int, error) {
			msg := &pulumirpc.InstallDependenciesResponse{}
			chunk := append([]byte(nil), b...)
			if stdout {
				msg.Stdout = chunk
			} else {
				msg.Stderr = chunk
			}
			mu.Lock()
			defer mu.Unlock()
			if err := stream.Send(msg); err != nil {
				return 0, err
			}
			return len(b), nil
		})
	}
	cmd.Stdout = send(true)
	cmd.Stderr = send(false)
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("`%s install` in %s failed: %w", pm, dir, err)
	}
	return nil
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(b []byte) (int, error) { return f(b) }
