package config

import (
	"strings"
	"unicode/utf8"
)

// Closest returns the candidate nearest to name, for a "did you mean"
// after an unknown key, variable, flag or command, or "" when none is near
// enough to be a likely typo.
//
// Nearness is the edit distance, ignoring case, with a swap of two
// neighbouring characters counted as one edit. The words the two share in
// front (up to a ".", "_" or "-" in both) are left out first, and the
// cut-off grows with what is left of name: one edit up to 7 characters, two
// up to 11, three beyond. So "population.userz" finds "population.users",
// while "population.size" finds nothing rather than "population.rate",
// three edits away but all of them in the one word that differs. Of equally
// near candidates the first wins.
func Closest(name string, candidates []string) string {
	best, bestD := "", 0
	for _, c := range candidates {
		if c == name {
			continue
		}
		a, b := strings.ToLower(name), strings.ToLower(c)
		n := sharedWords(a, b)
		a, b = a[n:], b[n:]
		limit := min(max(utf8.RuneCountInString(a)/4, 1), 3)
		if d := distance(a, b); d <= limit && (best == "" || d < bestD) {
			best, bestD = c, d
		}
	}
	return best
}

// sharedWords returns the length of the longest common prefix of a and b
// that ends in a separator.
func sharedWords(a, b string) int {
	n := 0
	for i := 0; i < len(a) && i < len(b) && a[i] == b[i]; i++ {
		if strings.IndexByte("._-", a[i]) >= 0 {
			n = i + 1
		}
	}
	return n
}

// distance is the optimal string alignment distance between a and b, in
// runes: insertions, deletions, substitutions and transpositions of
// adjacent runes, each counted once.
func distance(a, b string) int {
	s, t := []rune(a), []rune(b)
	// Three rows of the dynamic programme: i-2, i-1 and i.
	prev2 := make([]int, len(t)+1)
	prev := make([]int, len(t)+1)
	cur := make([]int, len(t)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(s); i++ {
		cur[0] = i
		for j := 1; j <= len(t); j++ {
			cost := 1
			if s[i-1] == t[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
			if i > 1 && j > 1 && s[i-1] == t[j-2] && s[i-2] == t[j-1] {
				cur[j] = min(cur[j], prev2[j-2]+1)
			}
		}
		prev2, prev, cur = prev, cur, prev2
	}
	return prev[len(t)]
}
