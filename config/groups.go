package config

import (
	"fmt"
	"strconv"
	"strings"
)

// Values of target.catch_up.
const (
	CatchUpOn  = "on"
	CatchUpOff = "off"
)

// GroupSpec is one entry of a group layout: Count groups of Size members.
// A Size larger than the population is the whole population.
type GroupSpec struct {
	Count, Size int
}

// maxLayoutGroups bounds the groups one layout makes: each is provisioned
// on the server and joined at every member's login.
const maxLayoutGroups = 100000

// ParseGroups reads population.groups (and a soak profile's groups): a
// group layout as comma-separated COUNTxSIZE entries, such as OpenIM's
// published "2x10000,5x1000,50x100,100x50", or "" for none. A size larger
// than the population is the whole population.
func ParseGroups(s string) ([]GroupSpec, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	var out []GroupSpec
	total := 0
	for _, e := range strings.Split(s, ",") {
		e = strings.TrimSpace(e)
		c, z, ok := strings.Cut(e, "x")
		if !ok {
			return nil, fmt.Errorf("entry %q: want COUNTxSIZE, such as 5x100", e)
		}
		count, err1 := strconv.Atoi(strings.TrimSpace(c))
		size, err2 := strconv.Atoi(strings.TrimSpace(z))
		switch {
		case err1 != nil || err2 != nil:
			return nil, fmt.Errorf("entry %q: count and size must be whole numbers", e)
		case count < 1:
			return nil, fmt.Errorf("entry %q: count must be at least 1", e)
		case size < 2:
			return nil, fmt.Errorf("entry %q: size must be at least 2, a group of one delivers nothing", e)
		}
		if total += count; total > maxLayoutGroups {
			return nil, fmt.Errorf("more than %d groups in all", maxLayoutGroups)
		}
		out = append(out, GroupSpec{Count: count, Size: size})
	}
	return out, nil
}

// GroupLayout returns the population's group layout, nil for group_size's.
// The configuration was checked when it loaded.
func (p Population) GroupLayout() []GroupSpec {
	g, _ := ParseGroups(p.Groups)
	return g
}

// GroupLayout returns the profile's group layout, nil for group_size's.
func (p Profile) GroupLayout() []GroupSpec {
	g, _ := ParseGroups(p.Groups)
	return g
}
