package rpc

import (
	"context"
	"sort"
)

// MethodsMethod is the standard method that lists a server's methods
// (protocol/spec.md 9.2): request {} (or empty), response
// {"methods":[{"name","kind","format"}...]} sorted by name, the standard
// methods left out. `udskit call ADDR --list` prints it.
const MethodsMethod = StdPrefix + "methods"

// MethodInfo describes one registered method, as MethodsMethod lists it.
type MethodInfo struct {
	Name string `json:"name"`
	// Kind is "unary", "stream" (server-streaming), "client_stream"
	// (client-streaming) or "bidi" (bidirectional).
	Kind string `json:"kind"`
	// Format is the payload encoding its handler expects: "json", "raw" or
	// "proto".
	Format string `json:"format"`
}

type methodsResponse struct {
	Methods []MethodInfo `json:"methods"`
}

// MethodInfos returns the registered methods, sorted by name, standard
// methods left out: what MethodsMethod answers.
func (s *Server) MethodInfos() []MethodInfo {
	m := *s.handlers.Load()
	out := make([]MethodInfo, 0, len(m))
	for name, h := range m {
		if h.std {
			continue
		}
		out = append(out, MethodInfo{Name: name, Kind: h.kind(), Format: h.codec})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// methodsHandler answers MethodsMethod; the request is ignored.
func (s *Server) methodsHandler(_ context.Context, _, dst []byte) ([]byte, error) {
	return JSON.Marshal(dst, methodsResponse{Methods: s.MethodInfos()})
}

// ListMethods calls MethodsMethod on c. A server too old to know it fails
// with Unimplemented.
func ListMethods(ctx context.Context, c *Client) ([]MethodInfo, error) {
	var resp methodsResponse
	if err := c.Call(ctx, MethodsMethod, struct{}{}, &resp); err != nil {
		return nil, err
	}
	return resp.Methods, nil
}
