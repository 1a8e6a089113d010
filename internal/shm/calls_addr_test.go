package shm

import (
	"sync/atomic"
	"unsafe"
)

func uintptrOf(b []byte) uintptr             { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }
func uintptrOfWord(p *atomic.Uint32) uintptr { return uintptr(unsafe.Pointer(p)) }
