//go:build !unix

package pcapng

import "os"

func writev(f *os.File, bufs [][]byte) (int64, error) {
	var total int64
	for _, b := range bufs {
		n, err := f.Write(b)
		total += int64(n)
		if err != nil {
			return total, err
		}
	}
	return total, nil
}
