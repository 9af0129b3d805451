// Command certmanager runs a reduced, real cert-manager (v1.21.x) next to the e2e control plane:
//
//   - the Certificate controllers: trigger, key-manager, request-manager, issuing, readiness,
//     revision-manager;
//   - the Issuer and ClusterIssuer controllers (selfSigned and CA issuer types only);
//   - the CertificateRequest approver plus the selfSigned and CA CertificateRequest signers;
//   - the CA injector for ValidatingWebhookConfiguration and MutatingWebhookConfiguration.
//
// It imports only published packages of the main module github.com/cert-manager/cert-manager.
// It replaces cmd/controller/app/controller.go (Run, buildControllerContextFactory) and
// cmd/cainjector/app/controller.go (Run), which live in separate, unpublished Go modules.
// There is no cert-manager webhook: the CRDs are applied from deploy/crds/ of the module zip.
//
// Usage: certmanager --kubeconfig=/path/admin.kubeconfig [--cluster-resource-namespace=kube-system] [-v=2]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/discovery"
	kscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	cmscheme "github.com/cert-manager/cert-manager/pkg/client/clientset/versioned/scheme"
	"github.com/cert-manager/cert-manager/pkg/controller"
	"github.com/cert-manager/cert-manager/pkg/controller/cainjector"
	logf "github.com/cert-manager/cert-manager/pkg/logs"
	"github.com/cert-manager/cert-manager/pkg/util"

	// Each of these packages registers its controller in controller.Known() from an init()
	// (pkg/controller/register.go). cmd/controller gets most of them only transitively, through
	// internal/apis/config/controller/v1alpha1/defaults.go, which we cannot import: import them here.
	crapprover "github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/approver"
	crca "github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/ca"
	crselfsigned "github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/selfsigned"
	"github.com/cert-manager/cert-manager/pkg/controller/certificates/issuing"
	"github.com/cert-manager/cert-manager/pkg/controller/certificates/keymanager"
	"github.com/cert-manager/cert-manager/pkg/controller/certificates/readiness"
	"github.com/cert-manager/cert-manager/pkg/controller/certificates/requestmanager"
	"github.com/cert-manager/cert-manager/pkg/controller/certificates/revisionmanager"
	"github.com/cert-manager/cert-manager/pkg/controller/certificates/trigger"
	clusterissuers "github.com/cert-manager/cert-manager/pkg/controller/clusterissuers"
	issuers "github.com/cert-manager/cert-manager/pkg/controller/issuers"

	// Issuer back-ends used by the (Cluster)Issuer controllers to set the Ready condition
	// (issuer.RegisterIssuer in init()). Same blank imports as cmd/controller/app/start.go,
	// minus acme, vault and venafi.
	_ "github.com/cert-manager/cert-manager/pkg/issuer/ca"
	_ "github.com/cert-manager/cert-manager/pkg/issuer/selfsigned"
)

// The controllers to run: cmd/controller's DefaultEnabledControllers minus ACME (orders,
// challenges, certificaterequests-issuer-acme), vault, venafi, ingress-shim and
// certificates-metrics.
var enabledControllers = []string{
	issuers.ControllerName,         // "issuers"
	clusterissuers.ControllerName,  // "clusterissuers"
	crapprover.ControllerName,      // "certificaterequests-approver" (nothing is signed unless Approved)
	crca.CRControllerName,          // "certificaterequests-issuer-ca"
	crselfsigned.CRControllerName,  // "certificaterequests-issuer-selfsigned"
	trigger.ControllerName,         // "certificates-trigger"
	issuing.ControllerName,         // "certificates-issuing"
	keymanager.ControllerName,      // "certificates-key-manager"
	requestmanager.ControllerName,  // "certificates-request-manager"
	readiness.ControllerName,       // "certificates-readiness"
	revisionmanager.ControllerName, // "certificates-revision-manager"
}

func main() {
	fs := flag.NewFlagSet("certmanager", flag.ExitOnError)
	// A private FlagSet on purpose: sigs.k8s.io/controller-runtime/pkg/client/config registers
	// "kubeconfig" on flag.CommandLine in an init(), so flag.String("kubeconfig", ...) would panic
	// with "flag redefined: kubeconfig".
	kubeconfig := fs.String("kubeconfig", "", "path to the kubeconfig of the control plane (required)")
	clusterResourceNamespace := fs.String("cluster-resource-namespace", "kube-system",
		"namespace holding the Secrets referenced by ClusterIssuers (CA key pair)")
	workers := fs.Int("concurrent-workers", 5, "workers per cert-manager controller")
	klog.InitFlags(fs) // -v=N etc.; cert-manager logs through klog (pkg/logs).
	_ = fs.Parse(os.Args[1:])
	if *kubeconfig == "" {
		fmt.Fprintln(os.Stderr, "certmanager: --kubeconfig is required")
		os.Exit(2)
	}

	logf.InitLogs()
	defer logf.FlushLogs()
	ctrl.SetLogger(logf.Log)

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx = logf.NewContext(ctx, logf.Log, "certmanager")

	if err := run(ctx, *kubeconfig, *clusterResourceNamespace, *workers); err != nil && !errors.Is(err, context.Canceled) {
		logf.Log.Error(err, "certmanager exited")
		logf.FlushLogs()
		os.Exit(1)
	}
}

func run(ctx context.Context, kubeconfig, clusterResourceNamespace string, workers int) error {
	log := logf.FromContext(ctx)

	restConfig, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return fmt.Errorf("loading kubeconfig: %w", err)
	}
	// The CRDs must be served before the informers start (cmd/cainjector waits up to 5 minutes the
	// same way; cmd/controller just lets its informers retry).
	if err := waitForCertManagerCRDs(ctx, restConfig); err != nil {
		return err
	}

	g, ctx := errgroup.WithContext(ctx)

	// ---- cert-manager controller: the part of cmd/controller/app/controller.go Run() we need ----
	// Mirrors buildControllerContextFactory(); the values are the ControllerConfiguration defaults
	// from internal/apis/config/controller/v1alpha1/defaults.go (not importable, so copied).
	ctxFactory, err := controller.NewContextFactory(ctx, controller.ContextOptions{
		Kubeconfig:         kubeconfig,
		KubernetesAPIQPS:   20, // ignored when the apiserver has API Priority and Fairness (it does)
		KubernetesAPIBurst: 50,
		Namespace:          "", // all namespaces
		IssuerOptions: controller.IssuerOptions{
			ClusterResourceNamespace:        clusterResourceNamespace,
			ClusterIssuerAmbientCredentials: true,
			IssuerAmbientCredentials:        false,
		},
		CertificateOptions: controller.CertificateOptions{
			EnableOwnerRef:           false,
			CopiedAnnotationPrefixes: []string{"*", "-kubectl.kubernetes.io/", "-fluxcd.io/", "-argocd.argoproj.io/"},
			// Zero would make the trigger controller retry a failed issuance without back-off;
			// these are the cmd defaults. UNSURE: the tests may want something shorter than 1h.
			CertificateRequestMinimumBackoffDuration: time.Hour,
			CertificateRequestMaximumBackoffDuration: 32 * time.Hour,
		},
		// ACMEOptions, IngressShimOptions, SchedulerOptions: only read by controllers not run here.
		// ConfigOptions.EnableGatewayAPI=false: no Gateway API discovery check in buildClients.
	})
	if err != nil {
		return fmt.Errorf("building controller context factory: %w", err)
	}
	// The base Context: its informer factories are shared (by pointer) with every Context that
	// the constructors build, so starting these starts the informers all controllers registered.
	baseCtx, err := ctxFactory.Build()
	if err != nil {
		return err
	}

	// Leader election: cmd/controller's startLeaderElection (Lease "cert-manager-controller")
	// is skipped. There is exactly one instance here; add client-go leaderelection around the loop
	// below if several ever run.
	known := controller.Known()
	for _, name := range enabledControllers {
		construct, ok := known[name]
		if !ok {
			return fmt.Errorf("controller %q is not registered (missing import?)", name)
		}
		iface, err := construct(ctxFactory) // calls Register(): adds informers and handlers
		if err != nil {
			return fmt.Errorf("constructing controller %q: %w", name, err)
		}
		g.Go(func() error {
			log.V(logf.InfoLevel).Info("starting controller", "controller", name)
			return iface.Run(workers, ctx) // waits for its informers to sync, blocks until ctx is done
		})
	}
	// Same order as cmd/controller: construct every controller first, then start the factories.
	baseCtx.SharedInformerFactory.Start(ctx.Done())
	baseCtx.KubeSharedInformerFactory.Start(ctx.Done())
	baseCtx.HTTP01ResourceMetadataInformersFactory.Start(ctx.Done()) // unused by these controllers; harmless

	// ---- cainjector: cmd/cainjector/app/controller.go Run(), trimmed ----
	scheme := runtime.NewScheme()
	utilruntime.Must(kscheme.AddToScheme(scheme)) // includes admissionregistration/v1
	utilruntime.Must(cmscheme.AddToScheme(scheme))
	// apiextensions/v1 and apiregistration/v1 (kube-aggregator) are only needed for the CRD and
	// APIService injectables, which are disabled below. UNSURE: add them anyway if the manager's
	// RESTMapper/cache ever complains.
	injectorConfig := util.RestConfigWithUserAgent(restConfig, "cainjector")
	// ctrl.GetConfig (used by cmd/cainjector) sets QPS=-1 (no client-side limit; the apiserver's
	// API Priority and Fairness throttles) when QPS is unset; do the same.
	injectorConfig.QPS = -1
	mgr, err := ctrl.NewManager(injectorConfig, ctrl.Options{
		Scheme: scheme,
		Cache: cache.Options{
			ReaderFailOnMissingInformer: true,
		},
		Client: client.Options{
			// As in cmd/cainjector: Secrets are read straight from the apiserver, only their
			// metadata is watched (builder.OnlyMetadata in pkg/controller/cainjector/setup.go).
			Cache: &client.CacheOptions{DisableFor: []client.Object{&corev1.Secret{}}},
		},
		LeaderElection:         false,
		Metrics:                metricsserver.Options{BindAddress: "0"}, // no metrics listener
		HealthProbeBindAddress: "0",                                     // no health listener
	})
	if err != nil {
		return fmt.Errorf("creating cainjector manager: %w", err)
	}
	if err := cainjector.RegisterAllInjectors(ctx, mgr, cainjector.SetupOptions{
		Namespace:                    "",
		EnableCertificatesDataSource: true, // cert-manager.io/inject-ca-from: <ns>/<Certificate>
		EnabledReconcilersFor: map[string]bool{
			cainjector.MutatingWebhookConfigurationName:   true,
			cainjector.ValidatingWebhookConfigurationName: true,
			cainjector.APIServiceName:                     false,
			cainjector.CustomResourceDefinitionName:       false,
		},
	}); err != nil {
		return fmt.Errorf("registering ca injectors: %w", err)
	}
	g.Go(func() error { return mgr.Start(ctx) })

	err = g.Wait()
	baseCtx.HTTP01ResourceMetadataInformersFactory.Shutdown()
	baseCtx.KubeSharedInformerFactory.Shutdown()
	baseCtx.SharedInformerFactory.Shutdown()
	return err
}

// waitForCertManagerCRDs polls discovery until cert-manager.io/v1 serves the resources these
// controllers watch (the CRDs are applied separately from the module's deploy/crds/*.yaml).
func waitForCertManagerCRDs(ctx context.Context, restConfig *rest.Config) error {
	dc, err := discovery.NewDiscoveryClientForConfig(restConfig)
	if err != nil {
		return err
	}
	want := []string{"certificates", "certificaterequests", "issuers", "clusterissuers"}
	return wait.PollUntilContextTimeout(ctx, time.Second, 5*time.Minute, true, func(context.Context) (bool, error) {
		list, err := dc.ServerResourcesForGroupVersion("cert-manager.io/v1")
		if err != nil {
			return false, nil // not yet served
		}
		have := map[string]bool{}
		for _, r := range list.APIResources {
			have[r.Name] = true
		}
		for _, w := range want {
			if !have[w] {
				return false, nil
			}
		}
		return true, nil
	})
}
