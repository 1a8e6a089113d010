package testspiffe

import (
	"encoding/pem"
	"net"
	"path/filepath"
	"sync"
	"testing"

	"google.golang.org/grpc"

	workload "github.com/spiffe/go-spiffe/v2/proto/spiffe/workload"

	"github.com/udskit/udskit/internal/testpki"
)

// WorkloadAPI serves the SPIFFE Workload API's FetchX509SVID over a unix
// socket, speaking the real gRPC protocol (go-spiffe's generated server), the
// way a SPIRE agent does for one workload: its SVID and the trust bundle,
// and a new message whenever rotate is called.
type WorkloadAPI struct {
	workload.UnimplementedSpiffeWorkloadAPIServer
	ca *testpki.CA
	id string

	mu        sync.Mutex
	current   *workload.X509SVIDResponse
	changed   chan struct{}
	federated map[string][]byte // trust domain ID -> its CA (DER), as SPIRE sends federated bundles
}

func derOf(pemBytes []byte) []byte {
	b, _ := pem.Decode(pemBytes)
	return b.Bytes
}

// Federate adds the bundle of another trust domain ("spiffe://partner.example",
// its CA ca) to what the workload receives, as an agent does for a
// registration that federates with it, and streams a new message.
func (w *WorkloadAPI) Federate(trustDomainID string, ca *testpki.CA) {
	w.mu.Lock()
	if w.federated == nil {
		w.federated = map[string][]byte{}
	}
	w.federated[trustDomainID] = ca.Cert.Raw
	w.mu.Unlock()
	w.Rotate()
}

// Rotate issues a new SVID and streams it to every watcher.
func (w *WorkloadAPI) Rotate() {
	p := w.ca.Issue(testpki.Leaf{CommonName: w.id, SPIFFEID: w.id, IPs: []net.IP{net.IPv4(127, 0, 0, 1)}})
	resp := &workload.X509SVIDResponse{Svids: []*workload.X509SVID{{
		SpiffeId: w.id, X509Svid: p.Cert.Raw, X509SvidKey: derOf(p.KeyPEM), Bundle: w.ca.Cert.Raw,
	}}}
	w.mu.Lock()
	if len(w.federated) > 0 {
		resp.FederatedBundles = map[string][]byte{}
		for td, der := range w.federated {
			resp.FederatedBundles[td] = der
		}
	}
	w.current = resp
	close(w.changed)
	w.changed = make(chan struct{})
	w.mu.Unlock()
}

func (w *WorkloadAPI) FetchX509SVID(_ *workload.X509SVIDRequest, stream grpc.ServerStreamingServer[workload.X509SVIDResponse]) error {
	for {
		w.mu.Lock()
		cur, changed := w.current, w.changed
		w.mu.Unlock()
		if err := stream.Send(cur); err != nil {
			return err
		}
		select {
		case <-changed:
		case <-stream.Context().Done():
			return nil
		}
	}
}

// Start serves id's SVIDs on a socket in dir; it returns the
// Workload API address and the server (for Rotate).
func Start(t *testing.T, dir string, ca *testpki.CA, id string) (string, *WorkloadAPI) {
	t.Helper()
	w := &WorkloadAPI{ca: ca, id: id, changed: make(chan struct{})}
	w.Rotate()
	path := filepath.Join(dir, filepath.Base(id)+".sock")
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	workload.RegisterSpiffeWorkloadAPIServer(s, w)
	go s.Serve(l)
	t.Cleanup(s.Stop)
	return "unix://" + path, w
}
