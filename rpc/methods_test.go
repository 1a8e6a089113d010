package rpc

import (
	"context"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/udskit/udskit/internal/testutil"
)

// TestListMethods: udskit.methods lists what was registered, sorted, with
// kind and format, and not the standard methods.
func TestListMethods(t *testing.T) {
	sock := filepath.Join(testutil.ShortDir(t, 0o700), "m.sock")
	s, _ := ffServer(t, sock, nil) // registers echo (raw, unary)
	HandleJSON(s, "zeta", func(ctx context.Context, in struct{}) (struct{}, error) { return in, nil })
	HandleJSONStream(s, "alpha", func(ctx context.Context, in struct{}, send func(struct{}) error) error { return nil })
	c, err := Dial(context.Background(), sock, ClientOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	got, err := ListMethods(context.Background(), c)
	if err != nil {
		t.Fatal(err)
	}
	want := []MethodInfo{{"alpha", "stream", "json"}, {"echo", "unary", "raw"}, {"zeta", "unary", "json"}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("methods %+v, want %+v", got, want)
	}
}
