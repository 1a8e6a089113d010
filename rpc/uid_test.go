package rpc

import "os"

func uidSelf() int { return os.Geteuid() }
