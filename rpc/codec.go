package rpc

import (
	"encoding/json"
	"fmt"

	"google.golang.org/protobuf/proto"
)

// Codec turns values into payload bytes and back. Payloads are opaque to the
// protocol; the codec is a convention between caller and handler.
type Codec interface {
	Name() string
	// Marshal appends the encoding of v to dst.
	Marshal(dst []byte, v any) ([]byte, error)
	Unmarshal(data []byte, v any) error
}

// Raw passes []byte (or *[]byte on Unmarshal) through.
var Raw Codec = rawCodec{}

// JSON is encoding/json.
var JSON Codec = jsonCodec{}

// Proto is protobuf (google.golang.org/protobuf); values are proto.Message.
var Proto Codec = protoCodec{}

type rawCodec struct{}

func (rawCodec) Name() string { return "raw" }
func (rawCodec) Marshal(dst []byte, v any) ([]byte, error) {
	switch b := v.(type) {
	case []byte:
		return append(dst, b...), nil
	case *[]byte:
		return append(dst, *b...), nil
	case string:
		return append(dst, b...), nil
	case nil:
		return dst, nil
	}
	return nil, fmt.Errorf("rpc: raw codec cannot marshal %T (want []byte)", v)
}
func (rawCodec) Unmarshal(data []byte, v any) error {
	p, ok := v.(*[]byte)
	if !ok {
		return fmt.Errorf("rpc: raw codec cannot unmarshal into %T (want *[]byte)", v)
	}
	*p = append((*p)[:0], data...)
	return nil
}

type jsonCodec struct{}

func (jsonCodec) Name() string { return "json" }
func (jsonCodec) Marshal(dst []byte, v any) ([]byte, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	return append(dst, b...), nil
}
func (jsonCodec) Unmarshal(data []byte, v any) error {
	if len(data) == 0 {
		return nil
	}
	return json.Unmarshal(data, v)
}

type protoCodec struct{}

func (protoCodec) Name() string { return "proto" }
func (protoCodec) Marshal(dst []byte, v any) ([]byte, error) {
	m, ok := v.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("rpc: proto codec cannot marshal %T (want proto.Message)", v)
	}
	return proto.MarshalOptions{}.MarshalAppend(dst, m)
}
func (protoCodec) Unmarshal(data []byte, v any) error {
	m, ok := v.(proto.Message)
	if !ok {
		return fmt.Errorf("rpc: proto codec cannot unmarshal into %T (want proto.Message)", v)
	}
	return proto.Unmarshal(data, m)
}

// codecFor picks the codec for a value when the client has none set:
// []byte/*[]byte raw, proto.Message protobuf, anything else JSON.
func codecFor(v any) Codec {
	switch v.(type) {
	case []byte, *[]byte:
		return Raw
	case proto.Message:
		return Proto
	}
	return JSON
}
