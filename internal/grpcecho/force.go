package grpcecho

import (
	"google.golang.org/grpc"
)

// ForceRawCodec makes a server decode every call with the raw codec,
// whatever content-subtype the client sent. Clients that cannot choose a
// codec by content-subtype (grpcio, grpc-js send plain "application/grpc")
// need it: with the default proto codec their raw bytes would not decode.
func ForceRawCodec() grpc.ServerOption {
	return grpc.ForceServerCodec(rawCodec{})
}
