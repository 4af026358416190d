// foreign-dra: a minimal DRA driver of another vendor, for gpufence's cluster tests only. It
// serves the node's GPUs as "foreign.example.com" devices and prepares a claim the way NVIDIA's
// DRA driver does: one transient CDI spec per claim, of its own kind, the devices named per claim
// ("<claim uid>-gpu-N"), each GPU's node by path alone (the runtime takes its numbers from the
// host). gpufence-nri must enforce such claims by the kind's listing in [cdi] gpu_kinds, never
// by the names. Built from the Go module proxy with upstream's kubeletplugin helper.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
)

const (
	driverName = "foreign.example.com"
	cdiKind    = driverName + "/claim"
)

type driver struct{ cdiDir string }

func (d *driver) specPath(uid types.UID) string {
	return filepath.Join(d.cdiDir, fmt.Sprintf("%s-claim_%s.json", driverName, uid))
}

func (d *driver) PrepareResourceClaims(_ context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	out := map[types.UID]kubeletplugin.PrepareResult{}
	for _, c := range claims {
		var result kubeletplugin.PrepareResult
		var devices []any
		if c.Status.Allocation != nil {
			for _, r := range c.Status.Allocation.Devices.Results {
				if r.Driver != driverName || !strings.HasPrefix(r.Device, "gpu-") {
					continue
				}
				name := fmt.Sprintf("%s-%s", c.UID, r.Device)
				devices = append(devices, map[string]any{"name": name, "containerEdits": map[string]any{
					"deviceNodes": []any{map[string]any{"path": "/dev/nvidia" + strings.TrimPrefix(r.Device, "gpu-")}}}})
				result.Devices = append(result.Devices, kubeletplugin.Device{Requests: []string{r.Request},
					PoolName: r.Pool, DeviceName: r.Device, CDIDeviceIDs: []string{cdiKind + "=" + name}})
			}
		}
		spec, _ := json.Marshal(map[string]any{"cdiVersion": "0.5.0", "kind": cdiKind,
			"containerEdits": map[string]any{"deviceNodes": []any{map[string]any{"path": "/dev/nvidiactl"}},
				"env": []string{"FOREIGN_CLAIM=" + string(c.UID)}},
			"devices": devices})
		tmp := d.specPath(c.UID) + ".tmp"
		if err := os.WriteFile(tmp, spec, 0o644); err != nil {
			result.Err = err
		} else if err := os.Rename(tmp, d.specPath(c.UID)); err != nil {
			result.Err = err
		}
		fmt.Printf("foreign-dra: prepared %s/%s: %d device(s)\n", c.Namespace, c.Name, len(result.Devices))
		out[c.UID] = result
	}
	return out, nil
}

func (d *driver) UnprepareResourceClaims(_ context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	out := map[types.UID]error{}
	for _, c := range claims {
		if err := os.Remove(d.specPath(c.UID)); err != nil && !os.IsNotExist(err) {
			out[c.UID] = err
			continue
		}
		fmt.Printf("foreign-dra: unprepared %s\n", c.UID)
		out[c.UID] = nil
	}
	return out, nil
}

func (d *driver) HandleError(_ context.Context, err error, msg string) {
	fmt.Fprintf(os.Stderr, "foreign-dra: %s: %v\n", msg, err)
}

func main() {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig")
	node := flag.String("node-name", "", "this node")
	cdiDir := flag.String("cdi-dir", "/var/run/cdi", "where claim specs are written")
	gpus := flag.Int("gpus", 2, "GPUs 0..N-1 to publish")
	registry := flag.String("registry-dir", "/var/lib/kubelet/plugins_registry", "the kubelet's plugin watcher directory")
	plugins := flag.String("plugin-dir", "/var/lib/kubelet/plugins/"+driverName, "the DRA socket's directory")
	flag.Parse()
	fail := func(err error) { fmt.Fprintln(os.Stderr, "foreign-dra:", err); os.Exit(1) }
	cfg, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		fail(err)
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		fail(err)
	}
	for _, dir := range []string{*cdiDir, *plugins} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			fail(err)
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	helper, err := kubeletplugin.Start(ctx, &driver{cdiDir: *cdiDir}, kubeletplugin.DriverName(driverName),
		kubeletplugin.KubeClient(client), kubeletplugin.NodeName(*node),
		kubeletplugin.RegistrarDirectoryPath(*registry), kubeletplugin.PluginDataDirectoryPath(*plugins))
	if err != nil {
		fail(err)
	}
	var devices []resourceapi.Device
	for i := 0; i < *gpus; i++ {
		devices = append(devices, resourceapi.Device{Name: fmt.Sprintf("gpu-%d", i)})
	}
	err = helper.PublishResources(ctx, resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{
		*node: {Slices: []resourceslice.Slice{{Devices: devices}}}}})
	if err != nil {
		fail(err)
	}
	fmt.Println("foreign-dra: serving")
	<-ctx.Done()
	helper.Stop()
}
