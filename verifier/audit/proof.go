package audit

import (
	"crypto/ed25519"
	"encoding/hex"
	"fmt"
	"sort"

	"github.com/agent-backplane/verifier/jcs"
	"github.com/agent-backplane/verifier/merkle"
)

// CheckProofBundle checks one event's inclusion-proof bundle (the JSON file the dashboard
// offers for download): the event's hash recomputed from its content is its hash; that hash
// as a leaf, with the audit path, gives the head's root; the head is signed by a trusted key.
// It returns a one-line summary, or a *Problem naming the first thing that fails.
func CheckProofBundle(value any, trusted map[string]bool) (string, error) {
	bundle, ok := value.(*jcs.Object)
	if !ok {
		return "", problemf("the bundle lacks its members: it is not a JSON object")
	}
	if bundle.Value("format") != bundleFormat {
		return "", problemf("not a %s file", bundleFormat)
	}
	for _, name := range []string{"event", "tree_head", "leaf_index", "tree_size", "audit_path"} {
		if _, present := bundle.Get(name); !present {
			return "", problemf("the bundle lacks '%s'", name)
		}
	}
	event, ok := bundle.Object("event")
	if !ok {
		return "", problemf("the bundle lacks an event object")
	}
	recomputed, err := jcs.SHA256Hex(event.Without("hash", "position"))
	if err != nil {
		return "", problemf("the event cannot be canonicalised: %v", err)
	}
	if recomputed != event.Value("hash") {
		return "", problemf("the event's content hashes to %s, not its recorded hash %s", recomputed,
			pyStr(event.Value("hash")))
	}
	head, ok := bundle.Object("tree_head")
	if !ok {
		return "", problemf("the bundle lacks a tree_head object")
	}
	size := bundle.Value("tree_size")
	if !pyEqual(size, head.Value("tree_size")) {
		return "", problemf("the proof is for tree size %s but the head is of size %s", pyStr(size),
			pyStr(head.Value("tree_size")))
	}
	path, root, problem := proofHashes(bundle.Value("audit_path"), head)
	if problem != nil {
		return "", problem
	}
	leaf, _ := merkle.EventLeafHash(recomputed)
	index, indexOK := asCount(bundle.Value("leaf_index"))
	count, sizeOK := asCount(size)
	if !indexOK || !sizeOK || !merkle.VerifyInclusion(leaf, index, count, path, root) {
		return "", problemf("the audit path does not lead from leaf %s to the root %s",
			pyStr(bundle.Value("leaf_index")), pyStr(head.Value("root_hash")))
	}
	key := signedBy(head, trusted)
	if key == "" {
		return "", problemf("the tree head is not signed by a trusted key")
	}
	return fmt.Sprintf("OK: event %s#%s (hash %s…) is leaf %d of the tree of %d signed at %s by %s…",
		pyStr(event.Value("task_id")), pyStr(event.Value("seq")), recomputed[:16], index, count,
		pyStr(head.Value("signed_at")), key[:16]), nil
}

func proofHashes(auditPath any, head *jcs.Object) ([][]byte, []byte, *Problem) {
	items, ok := auditPath.([]any)
	if !ok {
		return nil, nil, problemf("malformed hash in the bundle: audit_path is not a list")
	}
	path := make([][]byte, len(items))
	for i, item := range items {
		text, _ := item.(string)
		hash, err := merkle.HashFromHex(text)
		if err != nil {
			return nil, nil, problemf("malformed hash in the bundle: %v", err)
		}
		path[i] = hash
	}
	rootText, _ := head.String("root_hash")
	root, err := merkle.HashFromHex(rootText)
	if err != nil {
		return nil, nil, problemf("malformed hash in the bundle: %v", err)
	}
	return path, root, nil
}

// signedBy returns the trusted key whose signature the head carries, or "".
func signedBy(head *jcs.Object, trusted map[string]bool) string {
	message, err := treeHeadMessage(head.Value("tree_size"), head.Value("root_hash"), head.Value("signed_at"))
	text, isText := head.String("signature")
	signature, hexErr := hex.DecodeString(text)
	if err != nil || !isText || hexErr != nil {
		return ""
	}
	keys := make([]string, 0, len(trusted))
	for key := range trusted {
		keys = append(keys, key)
	}
	sort.Strings(keys)
	for _, key := range keys {
		raw, err := hex.DecodeString(key)
		if err == nil && len(raw) == ed25519.PublicKeySize && ed25519.Verify(raw, message, signature) {
			return key
		}
	}
	return ""
}
