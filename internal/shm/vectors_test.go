package shm

import (
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"testing"
)

type vecFile struct {
	FeatureFlag    uint8  `json:"feature_flag"`
	DescFlag       uint8  `json:"desc_flag"`
	TypeOffer      uint8  `json:"type_shm_offer"`
	TypeRelease    uint8  `json:"type_shm_release"`
	MinRegion      uint64 `json:"min_region"`
	MaxRegion      uint64 `json:"max_region"`
	RegionMultiple uint64 `json:"region_multiple"`
	Negotiate      []struct {
		Name, Client, Server string
		Features             uint8
		Shm                  bool
	}
	Offers struct {
		Valid []struct {
			Name, Hex string
			Size      uint64
		}
		Invalid []struct{ Name, Hex, Error string }
	}
	Answers struct {
		Valid []struct {
			Name, Hex string
			Accepted  bool
		}
		Invalid []struct{ Name, Hex, Error string }
	}
	Descriptors struct {
		RegionSize uint64 `json:"region_size"`
		MaxFrame   uint32 `json:"max_frame"`
		Entries    []struct {
			Name, Hex, Sender, Error string
			Outstanding              [][2]uint32
			OK                       bool
			Offset, Length           uint32
		}
	}
	Releases []struct {
		Name, Hex, Error string
		HandedOver       [][2]uint32 `json:"handed_over"`
		OK               bool
		Released         [][2]uint32
	}
}

func loadVectors(t testing.TB) *vecFile {
	_, file, _, _ := runtime.Caller(0)
	b, err := os.ReadFile(filepath.Join(filepath.Dir(file), "..", "..", "protocol", "vectors", "shm.json"))
	if err != nil {
		t.Fatal(err)
	}
	var v vecFile
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatal(err)
	}
	return &v
}

func unhex(t testing.TB, s string) []byte {
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func errName(err error) string {
	var e *Error
	if errors.As(err, &e) {
		return e.Name
	}
	return ""
}

func TestVectorConstants(t *testing.T) {
	v := loadVectors(t)
	if v.FeatureFlag != FeatureShm || v.DescFlag != FlagShm || v.TypeOffer != TypeOffer || v.TypeRelease != TypeRelease ||
		v.MinRegion != MinRegion || v.MaxRegion != MaxRegion || v.RegionMultiple != RegionMultiple {
		t.Fatalf("constants differ from shm.json: %+v", v)
	}
	for _, n := range v.Negotiate {
		c, s := unhex(t, n.Client), unhex(t, n.Server)
		f := c[5] & s[5]
		if f != n.Features || (f&FeatureShm != 0) != n.Shm {
			t.Errorf("%s: features %#x shm %v, want %#x %v", n.Name, f, f&FeatureShm != 0, n.Features, n.Shm)
		}
	}
}

func TestVectorOffers(t *testing.T) {
	v := loadVectors(t)
	for _, o := range v.Offers.Valid {
		size, err := ParseOffer(unhex(t, o.Hex))
		if err != nil || size != o.Size {
			t.Errorf("%s: %d, %v; want %d", o.Name, size, err, o.Size)
		}
		if got := AppendOffer(nil, o.Size); hex.EncodeToString(got) != o.Hex {
			t.Errorf("%s: AppendOffer %x, want %s", o.Name, got, o.Hex)
		}
	}
	for _, o := range v.Offers.Invalid {
		b := unhex(t, o.Hex)
		// The server reads exactly OfferSize bytes; a longer frame is
		// judged on those.
		if len(b) > OfferSize {
			b = b[:OfferSize]
		}
		if _, err := ParseOffer(b); errName(err) != o.Error {
			t.Errorf("%s: %v, want %s", o.Name, err, o.Error)
		}
	}
}

func TestVectorAnswers(t *testing.T) {
	v := loadVectors(t)
	if len(v.Answers.Valid) == 0 || len(v.Answers.Invalid) == 0 {
		t.Fatal("no answer vectors")
	}
	for _, a := range v.Answers.Valid {
		ok, err := ParseAnswer(unhex(t, a.Hex))
		if err != nil || ok != a.Accepted {
			t.Errorf("%s: %v %v", a.Name, ok, err)
		}
		if got := hex.EncodeToString(AppendAnswer(nil, a.Accepted)); got != a.Hex {
			t.Errorf("%s: AppendAnswer %s, want %s", a.Name, got, a.Hex)
		}
	}
	for _, a := range v.Answers.Invalid {
		b := unhex(t, a.Hex)
		if len(b) > AnswerSize {
			b = b[:AnswerSize]
		}
		if _, err := ParseAnswer(b); errName(err) != a.Error {
			t.Errorf("%s: %v, want %s", a.Name, err, a.Error)
		}
	}
}

func TestVectorDescriptors(t *testing.T) {
	v := loadVectors(t)
	S := v.Descriptors.RegionSize
	cl, sv := Halves(S)
	for _, e := range v.Descriptors.Entries {
		b := unhex(t, e.Hex)
		if b[1]&FlagShm == 0 {
			t.Fatalf("%s: no shm flag", e.Name)
		}
		payload := b[16+int(binary.LittleEndian.Uint16(b[2:])):]
		if len(payload) != int(binary.LittleEndian.Uint32(b[8:])) {
			t.Fatalf("%s: bad vector framing", e.Name)
		}
		half := cl
		if e.Sender == "server" {
			half = sv
		}
		tr := NewTracker(half[0], half[1], v.Descriptors.MaxFrame)
		for _, o := range e.Outstanding {
			if err := tr.Accept(Desc{o[0], o[1]}); err != nil {
				t.Fatalf("%s: outstanding %v: %v", e.Name, o, err)
			}
		}
		d, err := ParseDesc(payload)
		if err == nil {
			err = tr.Accept(d)
		}
		if e.OK {
			if err != nil || d.Off != e.Offset || d.Len != e.Length {
				t.Errorf("%s: %+v %v, want (%d, %d)", e.Name, d, err, e.Offset, e.Length)
			}
		} else if errName(err) != e.Error {
			t.Errorf("%s: %v, want %s", e.Name, err, e.Error)
		}
	}
}

func TestVectorReleases(t *testing.T) {
	v := loadVectors(t)
	for _, r := range v.Releases {
		b := unhex(t, r.Hex)
		a := NewAlloc(0, 1<<30)
		for _, o := range r.HandedOver {
			a.out[o[0]] = o[1] // as if handed over; granule marks are not what is tested here
		}
		var got [][2]uint32
		err := ParseRelease(binary.LittleEndian.Uint32(b[4:]), int(binary.LittleEndian.Uint16(b[2:])), b[16+int(binary.LittleEndian.Uint16(b[2:])):],
			func(d Desc) error {
				if n, ok := a.out[d.Off]; !ok || n != d.Len {
					return errf(NameBadRelease, "unknown slot")
				}
				delete(a.out, d.Off)
				got = append(got, [2]uint32{d.Off, d.Len})
				return nil
			})
		if r.OK {
			if err != nil || len(got) != len(r.Released) {
				t.Errorf("%s: %v %v, want %v", r.Name, got, err, r.Released)
				continue
			}
			for i := range got {
				if got[i] != r.Released[i] {
					t.Errorf("%s: %v, want %v", r.Name, got, r.Released)
				}
			}
		} else if errName(err) != r.Error {
			t.Errorf("%s: %v, want %s", r.Name, err, r.Error)
		}
	}
}
