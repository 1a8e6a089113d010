//go:build !linux

package main

import "errors"

func runCell(cfg config, v variant) (result, error) {
	return result{}, errors.New("shmprobe needs Linux (memfd, futex on a shared mapping)")
}

func childMain() int { return 2 }
