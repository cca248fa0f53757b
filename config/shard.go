package config

import (
	"fmt"
	"strconv"
	"strings"
)

// maxShards bounds shard counts: far more than one target needs, small
// enough that a typo is caught.
const maxShards = 1000

// Shard is this daemon's place among the shards of one deployment. Each
// shard keeps its own users (its names carry its index), its own canary,
// and exports every series with a shard label; Prometheus sums the shards.
// Nothing is shared between shards at run time: a shard's canary messages
// its neighbour's, and each process's ledger counts what it receives.
type Shard struct {
	Index, Count int
}

// Sharded reports whether there is more than one shard.
func (s Shard) Sharded() bool { return s.Count > 1 }

// String is the shard as a spec, "I/N", whatever form it was given in.
func (s Shard) String() string { return fmt.Sprintf("%d/%d", s.Index, s.Count) }

// Label is the value of the shard label.
func (s Shard) Label() string { return strconv.Itoa(s.Index) }

// Next and Prev are the neighbouring shards on the ring.
func (s Shard) Next() int { return (s.Index + 1) % s.Count }
func (s Shard) Prev() int { return (s.Index + s.Count - 1) % s.Count }

// ParseShard reads a shard spec: "" is the only shard (0 of 1); "I/N" is
// shard I of N; "auto/N" takes I from the ordinal at the end of hostname
// ("imcanary-3" is 3), which is how a StatefulSet's pods are named.
func ParseShard(spec, hostname string) (Shard, error) {
	if spec == "" {
		return Shard{Index: 0, Count: 1}, nil
	}
	idx, cnt, ok := strings.Cut(spec, "/")
	if !ok {
		return Shard{}, fmt.Errorf("want I/N or auto/N")
	}
	n, err := strconv.Atoi(cnt)
	if err != nil || n < 1 || n > maxShards {
		return Shard{}, fmt.Errorf("shard count %q: must be 1 to %d", cnt, maxShards)
	}
	if idx == "auto" {
		i := strings.LastIndexByte(hostname, '-')
		ord, err := strconv.Atoi(hostname[i+1:])
		if i < 0 || err != nil || ord < 0 {
			return Shard{}, fmt.Errorf("auto: host name %q does not end in -ORDINAL (a StatefulSet pod's does); give I/N instead", hostname)
		}
		idx = strconv.Itoa(ord)
	}
	i, err := strconv.Atoi(idx)
	if err != nil || i < 0 || i >= n {
		return Shard{}, fmt.Errorf("shard index %q: must be 0 to %d", idx, n-1)
	}
	return Shard{Index: i, Count: n}, nil
}
