// Package audit checks an audit export, and an event's inclusion-proof bundle, with nothing
// but the export's files and the trusted public keys.
package audit

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math/big"
	"sort"
	"strings"

	"github.com/agent-backplane/verifier/jcs"
	"github.com/agent-backplane/verifier/merkle"
)

// Problem is the first thing in an export that does not verify; its message names the segment
// (and the line) where.
type Problem struct{ Message string }

func (p *Problem) Error() string { return p.Message }

func problemf(format string, args ...any) *Problem {
	return &Problem{Message: fmt.Sprintf(format, args...)}
}

// Summary is what a successful verification established.
type Summary struct {
	Location string
	Segments int
	Events   int
	Tasks    int
	TreeSize uint64
	RootHash string
	SignedAt string
	Notes    []string
	Gated    *GatedCalls
}

// String is the report printed on success, the reference verifier's words.
func (s *Summary) String() string {
	lines := []string{
		fmt.Sprintf("OK %s: %d segment(s), %d event(s), %d task(s)", s.Location, s.Segments, s.Events, s.Tasks),
		fmt.Sprintf("tree size %d, root %s, signed at %s", s.TreeSize, s.RootHash, s.SignedAt),
		s.Gated.Summary(),
	}
	for _, note := range s.Notes {
		lines = append(lines, "note: "+note)
	}
	return strings.Join(lines, "\n")
}

// chainLink is where a task's chain has got to: its last seq and that event's hash.
type chainLink struct {
	seq  *big.Int
	hash string
}

// state is what the segments read so far have established.
type state struct {
	frontier               merkle.Frontier
	previousManifestSHA256 string
	chains                 map[string]chainLink
	gated                  *GatedCalls
}

// VerifyExport checks every segment at the store against the trusted keys (lowercase hex),
// in order from 1, and stops at the first problem (a *Problem). Any other error means the
// location could not be read.
func VerifyExport(store Store, trusted map[string]bool) (*Summary, error) {
	names, err := store.Names()
	if err != nil {
		return nil, err
	}
	var numbers []uint64
	for _, name := range names {
		if number, ok := manifestNumber(name); ok {
			numbers = append(numbers, number)
		}
	}
	sort.Slice(numbers, func(i, j int) bool { return numbers[i] < numbers[j] })
	if len(numbers) == 0 {
		return nil, problemf("no audit segment manifests at %s", store.URL())
	}
	for i, number := range numbers {
		if expected := uint64(i + 1); number != expected {
			return nil, problemf("segment %d is missing: there is no %s", expected, manifestName(expected))
		}
	}
	st := &state{previousManifestSHA256: genesisHash, chains: map[string]chainLink{}, gated: newGatedCalls()}
	summary := &Summary{Location: store.URL()}
	for _, number := range numbers {
		raw, found, err := store.Read(manifestName(number))
		if err != nil {
			return nil, err
		}
		if !found {
			return nil, problemf("segment %d: %s disappeared while reading", number, manifestName(number))
		}
		manifest, problem := checkManifest(number, raw, st, trusted)
		if problem != nil {
			return nil, problem
		}
		// 3. The segment file must be byte for byte what the signed manifest describes.
		data, found, err := store.Read(segmentName(number))
		if err != nil {
			return nil, err
		}
		if !found {
			return nil, problemf("segment %d: %s is missing", number, segmentName(number))
		}
		digest := sha256.Sum256(data)
		if actual := hex.EncodeToString(digest[:]); actual != manifest.Value("segment_sha256") {
			return nil, problemf("segment %d (%s): its SHA-256 is %s, the manifest says %s: the file was changed",
				number, segmentName(number), actual, pyStr(manifest.Value("segment_sha256")))
		}
		events, problem := checkEvents(number, data, manifest, st)
		if problem != nil {
			return nil, problem
		}
		summary.Events += events
		manifestDigest := sha256.Sum256(raw)
		st.previousManifestSHA256 = hex.EncodeToString(manifestDigest[:])
		summary.Segments++
		head, _ := manifest.Object("signed_tree_head")
		summary.SignedAt, _ = head.String("signed_at")
	}
	summary.Tasks = len(st.chains)
	summary.Gated = st.gated
	summary.TreeSize = st.frontier.Size()
	summary.RootHash = hex.EncodeToString(st.frontier.Root())
	last := numbers[len(numbers)-1]
	var unfinished []string
	for _, name := range names {
		if number, ok := segmentNumber(name); ok && number > last {
			unfinished = append(unfinished, segmentName(number))
		}
	}
	if len(unfinished) > 0 {
		summary.Notes = append(summary.Notes, strings.Join(unfinished, ", ")+" has no manifest yet (an export in "+
			"progress or interrupted); not verified")
	}
	summary.Notes = append(summary.Notes, "an export can only be checked as far as it goes: compare the tree size "+
		"and root with the latest signed tree head (GET /api/v1/seals/latest/) to see that nothing was cut off the end")
	return summary, nil
}

// checkManifest is steps 1 and 2: the manifest, then the tree head it embeds.
func checkManifest(number uint64, raw []byte, st *state, trusted map[string]bool) (*jcs.Object, *Problem) {
	where := fmt.Sprintf("segment %d (%s)", number, manifestName(number))
	parsed, err := jcs.ParseBytes(raw)
	if err != nil {
		return nil, problemf("%s: the manifest is not valid JSON (%v)", where, err)
	}
	manifest, ok := parsed.(*jcs.Object)
	if !ok {
		return nil, problemf("%s: the manifest is not a JSON object", where)
	}
	if format := manifest.Value("format"); format != manifestFormat {
		return nil, problemf("%s: unknown manifest format %s", where, pyRepr(format))
	}
	// 1. The signature first: nothing else in the manifest means anything until a trusted key
	//    vouches for it.
	signer, ok := manifest.String("public_key")
	if !ok || !trusted[signer] {
		return nil, problemf("%s: the manifest is signed by %s, which is not a trusted public key", where,
			pyRepr(manifest.Value("public_key")))
	}
	message, err := manifestMessage(manifest)
	if err != nil || !signatureValid(signer, manifest.Value("signature"), message) {
		return nil, problemf("%s: the manifest's signature does not verify", where)
	}
	if segment := manifest.Value("segment"); !pyEqual(segment, jcs.Number(fmt.Sprint(number))) {
		return nil, problemf("%s: the manifest is that of segment %s", where, pyRepr(segment))
	}
	if previous := manifest.Value("previous_manifest_sha256"); previous != st.previousManifestSHA256 {
		return nil, problemf("%s: previous_manifest_sha256 is %s, but the previous manifest's SHA-256 is %s: "+
			"the manifest chain is broken", where, pyRepr(previous), st.previousManifestSHA256)
	}
	first, okFirst := asCount(manifest.Value("first_leaf"))
	last, okLast := asCount(manifest.Value("last_leaf"))
	size, okSize := asCount(manifest.Value("tree_size"))
	events, okEvents := asCount(manifest.Value("events"))
	if !(okFirst && okLast && okSize && okEvents) {
		return nil, problemf("%s: first_leaf, last_leaf, tree_size and events must be counts", where)
	}
	if first != st.frontier.Size() || last+1 != size || size <= first || events != size-first {
		return nil, problemf("%s: the range [%d, %d] (tree size %d, %d events) does not continue the previous "+
			"segment, which ended at tree size %d", where, first, last, size, events, st.frontier.Size())
	}
	if file := manifest.Value("segment_file"); file != segmentName(number) {
		return nil, problemf("%s: segment_file is %s", where, pyRepr(file))
	}
	if !isLowerHex(manifest.Value("segment_sha256"), 64) || !isLowerHex(manifest.Value("root_hash"), 64) {
		return nil, problemf("%s: segment_sha256 and root_hash must be 64 lowercase hex digits", where)
	}
	// 2. The sealer's signed head is what the events must hash to.
	head, ok := manifest.Object("signed_tree_head")
	if !ok {
		return nil, problemf("%s: no signed_tree_head", where)
	}
	if !pyEqual(head.Value("tree_size"), manifest.Value("tree_size")) ||
		head.Value("root_hash") != manifest.Value("root_hash") {
		return nil, problemf("%s: the signed tree head is not the manifest's tree size and root", where)
	}
	headKey, ok := head.String("public_key")
	if !ok || !trusted[headKey] {
		return nil, problemf("%s: the tree head is signed by %s, not a trusted key", where,
			pyRepr(head.Value("public_key")))
	}
	signedAt, ok := head.String("signed_at")
	if ok {
		message, err = treeHeadMessage(manifest.Value("tree_size"), manifest.Value("root_hash"), signedAt)
	}
	if !ok || err != nil || !signatureValid(headKey, head.Value("signature"), message) {
		return nil, problemf("%s: the signed tree head's signature does not verify", where)
	}
	return manifest, nil
}

// checkEvents is steps 4 to 6 for one segment file, and returns its number of events.
func checkEvents(number uint64, data []byte, manifest *jcs.Object, st *state) (int, *Problem) {
	where := fmt.Sprintf("segment %d (%s)", number, segmentName(number))
	if len(data) > 0 && data[len(data)-1] != '\n' {
		return 0, problemf("%s: the file does not end with a newline (truncated?)", where)
	}
	var lines [][]byte
	if len(data) > 0 {
		lines = bytes.Split(data[:len(data)-1], []byte("\n"))
	}
	for i, line := range lines {
		at := fmt.Sprintf("%s line %d", where, i+1)
		event, err := jcs.ParseBytes(line)
		if err != nil {
			return 0, problemf("%s: not valid JSON (%v)", at, err)
		}
		recomputed, problem := checkChainLink(event, st.chains, at)
		if problem != nil {
			return 0, problem
		}
		if problem := st.gated.see(event.(*jcs.Object), recomputed, at); problem != nil {
			return 0, problem
		}
		// The leaf is built from the recomputed hash, never from the stored one.
		leaf, _ := merkle.EventLeafHash(recomputed)
		st.frontier.Append(leaf)
	}
	events, _ := asCount(manifest.Value("events"))
	if uint64(len(lines)) != events {
		return 0, problemf("%s: %d event line(s), but the manifest's range holds %d", where, len(lines), events)
	}
	// 5. Everything so far chains; only the signed root shows a history recomputed by its author.
	if hex.EncodeToString(st.frontier.Root()) != manifest.Value("root_hash") {
		size, _ := asCount(manifest.Value("tree_size"))
		return 0, problemf("%s: the events' recomputed hashes do not give the signed tree head's root at tree "+
			"size %d: events were changed after they were sealed", where, size)
	}
	return len(lines), nil
}

// eventHash is an event's hash recomputed from its content (docs/api.md): the API's Event
// object without hash and position, RFC 8785, SHA-256. It returns the task id and seq too, and
// checks that the result is the stored hash.
func eventHash(value any, at string) (*jcs.Object, string, *big.Int, string, *Problem) {
	event, ok := value.(*jcs.Object)
	if !ok {
		return nil, "", nil, "", problemf("%s: not a JSON object", at)
	}
	taskID, okTask := event.String("task_id")
	seqNumber, okSeq := event.Value("seq").(jcs.Number)
	var seq *big.Int
	if okSeq {
		seq, okSeq = seqNumber.Integer()
	}
	_, okPrev := event.String("prev_hash")
	if !okTask || !okSeq || !okPrev {
		return nil, "", nil, "", problemf("%s: not an event (task_id, seq and prev_hash are required)", at)
	}
	recomputed, err := jcs.SHA256Hex(event.Without("hash", "position"))
	if err != nil {
		return nil, "", nil, "", problemf("%s: task %s seq %s cannot be canonicalised (%v)", at, taskID, seq, err)
	}
	if stored := event.Value("hash"); stored != recomputed {
		return nil, "", nil, "", problemf("%s: task %s seq %s: the hash recomputed from its content is %s, not the "+
			"stored %s", at, taskID, seq, recomputed, pyRepr(stored))
	}
	return event, taskID, seq, recomputed, nil
}

// checkChainLink is step 4 for one event: its hash, and its place as the next link of its
// task's chain (a task's first event is seq 1 on the genesis hash). It records the link and
// returns the recomputed hash.
func checkChainLink(value any, chains map[string]chainLink, at string) (string, *Problem) {
	event, taskID, seq, recomputed, problem := eventHash(value, at)
	if problem != nil {
		return "", problem
	}
	last, seen := chains[taskID]
	if !seen {
		last = chainLink{seq: big.NewInt(0), hash: genesisHash}
	}
	expected := new(big.Int).Add(last.seq, big.NewInt(1))
	if seq.Cmp(expected) != 0 {
		return "", problemf("%s: task %s has seq %s where seq %s was expected", at, taskID, seq, expected)
	}
	if prev, _ := event.String("prev_hash"); prev != last.hash {
		target := "the genesis hash"
		if last.seq.Sign() != 0 {
			target = fmt.Sprintf("seq %s's hash", last.seq)
		}
		return "", problemf("%s: task %s seq %s: prev_hash does not link to %s", at, taskID, seq, target)
	}
	chains[taskID] = chainLink{seq: seq, hash: recomputed}
	return recomputed, nil
}

// EventsSummary is what checking a stream of events established.
type EventsSummary struct {
	Source  string
	Events  int
	Tasks   int
	Repeats int
	Gated   *GatedCalls
}

func (s *EventsSummary) String() string {
	return fmt.Sprintf("OK %s: %d event(s) of %d task(s), each task's chain whole from seq 1; %d repeat(s) of an "+
		"event already read, dropped\n%s", s.Source, s.Events, s.Tasks, s.Repeats, s.Gated.Summary())
}

// VerifyEventLines checks events read from the event log's stream, one JSON object a line:
// every task's chain from seq 1, in the order its events come. The stream delivers at least
// once, so an event read again must be exactly the one read before, and is then dropped.
func VerifyEventLines(data []byte, source string) (*EventsSummary, error) {
	chains := map[string]chainLink{}
	seen := map[string]string{} // "task id seq" -> recomputed hash
	summary := &EventsSummary{Source: source, Gated: newGatedCalls()}
	for i, line := range bytes.Split(data, []byte("\n")) {
		if len(bytes.TrimLeft(line, " \t\n\r\v\f")) == 0 {
			continue
		}
		at := fmt.Sprintf("%s line %d", source, i+1)
		value, err := jcs.ParseBytes(line)
		if err != nil {
			return nil, problemf("%s: not valid JSON (%v)", at, err)
		}
		event, taskID, seq, recomputed, problem := eventHash(value, at)
		if problem != nil {
			return nil, problem
		}
		key := taskID + " " + seq.String()
		if before, repeated := seen[key]; repeated {
			if before != recomputed {
				return nil, problemf("%s: task %s seq %s was read before with another content", at, taskID, seq)
			}
			summary.Repeats++
			continue
		}
		if _, problem := checkChainLink(event, chains, at); problem != nil {
			return nil, problem
		}
		seen[key] = recomputed
		if problem := summary.Gated.see(event, recomputed, at); problem != nil {
			return nil, problem
		}
		summary.Events++
	}
	summary.Tasks = len(chains)
	return summary, nil
}
