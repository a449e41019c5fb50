package audit

import (
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"
	"unicode"

	"github.com/agent-backplane/verifier/jcs"
)

// The audit segment format (docs/audit.md): segment N of an export is two objects,
// segment-NNNNNNNN.jsonl (its events, one canonical JSON object a line, in leaf order) and
// segment-NNNNNNNN.manifest.json (what the sealer's key signs about it).
const (
	manifestFormat = "backplane-audit-segment/1"
	bundleFormat   = "backplane-inclusion-proof/1"
	genesisHash    = "0000000000000000000000000000000000000000000000000000000000000000"
)

// The exporter writes eight ASCII digits; names are matched as the reference verifier matches
// them (any decimal digits, eight or more, and a final newline tolerated), so that both see the
// same set of segments in a location someone has added files to.
var (
	manifestPattern = regexp.MustCompile(`^segment-(\p{Nd}{8,})\.manifest\.json\n?$`)
	segmentPattern  = regexp.MustCompile(`^segment-(\p{Nd}{8,})\.jsonl\n?$`)
)

func segmentName(number uint64) string  { return fmt.Sprintf("segment-%08d.jsonl", number) }
func manifestName(number uint64) string { return fmt.Sprintf("segment-%08d.manifest.json", number) }

func manifestNumber(name string) (uint64, bool) { return numberIn(manifestPattern, name) }
func segmentNumber(name string) (uint64, bool)  { return numberIn(segmentPattern, name) }

func numberIn(pattern *regexp.Regexp, name string) (uint64, bool) {
	match := pattern.FindStringSubmatch(name)
	if match == nil {
		return 0, false
	}
	var ascii strings.Builder
	for _, r := range match[1] {
		ascii.WriteByte(byte('0' + digitValue(r)))
	}
	number, err := strconv.ParseUint(ascii.String(), 10, 64)
	if err != nil {
		return math.MaxUint64, true
	}
	return number, true
}

// digitValue of a decimal digit of any script: Unicode lays each script's digits out as a run
// of ten from zero, and runs that touch each other are whole runs.
func digitValue(r rune) int {
	start := r
	for unicode.Is(unicode.Nd, start-1) {
		start--
	}
	return int(r-start) % 10
}

// manifestMessage is what a manifest's signature covers: every member but the signature,
// canonicalised.
func manifestMessage(manifest *jcs.Object) ([]byte, error) {
	return jcs.Canonical(manifest.Without("signature"))
}

// treeHeadMessage is what a signed tree head's signature covers: RFC 8785 of its size, root
// and time.
func treeHeadMessage(treeSize any, rootHash, signedAt any) ([]byte, error) {
	return jcs.Canonical(&jcs.Object{
		Keys:   []string{"tree_size", "root_hash", "signed_at"},
		Values: map[string]any{"tree_size": treeSize, "root_hash": rootHash, "signed_at": signedAt},
	})
}
