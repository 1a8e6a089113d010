package main

import (
	"encoding/binary"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// straceDumped counts exactly the bytes strace's -e write=all dumps.
func TestStraceDumped(t *testing.T) {
	file := filepath.Join(t.TempDir(), "strace.txt")
	cmd := exec.Command("strace", "-f", "-qq", "-o", file, "-e", "trace=write", "-e", "write=all", "head", "-c", "3001", "/dev/zero")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("strace (scripts/install-deps.sh installs it): %v\n%s", err, out)
	}
	n, err := straceDumped(file)
	if err != nil || n != 3001 {
		t.Fatalf("straceDumped = %d, %v; want 3001", n, err)
	}
}

// pcapFrame is an Ethernet + IPv4 + TCP frame from sport to dport.
func pcapFrame(sport, dport uint16, payload int) []byte {
	b := make([]byte, 14+20+20+payload)
	binary.BigEndian.PutUint16(b[12:], 0x0800)
	ip := b[14:]
	ip[0] = 0x45
	ip[9] = 6
	tcp := ip[20:]
	binary.BigEndian.PutUint16(tcp[0:], sport)
	binary.BigEndian.PutUint16(tcp[2:], dport)
	tcp[12] = 5 << 4
	return b
}

func writePcap(t testing.TB, frames ...[]byte) string {
	b := binary.LittleEndian.AppendUint32(nil, 0xa1b2c3d4)
	b = append(b, make([]byte, 20)...)
	for _, f := range frames {
		b = append(b, make([]byte, 8)...)
		b = binary.LittleEndian.AppendUint32(b, uint32(len(f)))
		b = binary.LittleEndian.AppendUint32(b, uint32(len(f)))
		b = append(b, f...)
	}
	file := filepath.Join(t.TempDir(), "x.pcap")
	if err := os.WriteFile(file, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return file
}

// pcapPayloadTo sums the payload toward the port only, and a file cut in
// a record counts what is whole.
func TestPcapPayloadTo(t *testing.T) {
	file := writePcap(t, pcapFrame(40000, 8080, 5), pcapFrame(8080, 40000, 3), pcapFrame(40000, 8080, 7), pcapFrame(40000, 9090, 11))
	if n, err := pcapPayloadTo(file, 8080); err != nil || n != 12 {
		t.Fatalf("pcapPayloadTo = %d, %v; want 12", n, err)
	}
	b, _ := os.ReadFile(file)
	os.WriteFile(file, b[:len(b)-30], 0o600)
	if n, err := pcapPayloadTo(file, 8080); err != nil || n != 12 {
		t.Fatalf("cut file: pcapPayloadTo = %d, %v; want 12", n, err)
	}
	os.WriteFile(file, []byte("not a pcap file at all, really"), 0o600)
	if _, err := pcapPayloadTo(file, 8080); err == nil {
		t.Fatal("no error for a file that is not pcap")
	}
}

// FuzzPcapPayloadTo: any file ends in an answer or an error, and the
// payload counted never exceeds the file.
func FuzzPcapPayloadTo(f *testing.F) {
	f.Add(pcapFrame(1, 8080, 10))
	f.Add([]byte{0x45, 0, 0, 0})
	f.Fuzz(func(t *testing.T, frame []byte) {
		file := writePcap(t, frame, frame)
		n, err := pcapPayloadTo(file, 8080)
		if err == nil && n > int64(2*len(frame)) {
			t.Fatalf("%d payload bytes from %d bytes of frames", n, 2*len(frame))
		}
	})
}
