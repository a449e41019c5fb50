package audit

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"testing"

	"github.com/agent-backplane/verifier/internal/vectors"
	"github.com/agent-backplane/verifier/jcs"
)

// firstInvalidSeq checks a task's events as links of its chain and returns the seq of the
// first that is not one (0 when the whole chain holds).
func firstInvalidSeq(t *testing.T, events []*jcs.Object) uint64 {
	chains := map[string]chainLink{}
	for i, event := range events {
		if _, problem := checkChainLink(event, chains, fmt.Sprintf("event %d", i)); problem != nil {
			return vectors.Uint(t, event, "seq")
		}
	}
	return 0
}

func TestTheProductsChainsHoldOrBreakWhereTheVectorsSay(t *testing.T) {
	file := vectors.Load(t, "product.json")
	chains := vectors.Objects(t, file, "chains")
	if len(chains) < 4 {
		t.Fatalf("%d chains", len(chains))
	}
	for _, chain := range chains {
		name, _ := chain.String("name")
		events := vectors.Objects(t, chain, "events")
		var want uint64
		if chain.Value("valid") != true {
			want = vectors.Uint(t, chain, "first_invalid_seq")
		}
		if got := firstInvalidSeq(t, events); got != want {
			t.Errorf("%s: first invalid seq %d, want %d", name, got, want)
		}
	}
	// The valid chain's hashes are the product's, byte for byte: 1e21, -0.0, an integer beyond
	// 2^53, a character outside the BMP and keys that sort differently by code unit and point.
	for _, event := range vectors.Objects(t, chains[0], "events") {
		recomputed, err := jcs.SHA256Hex(event.Without("hash", "position"))
		if err != nil || recomputed != event.Value("hash") {
			t.Errorf("seq %v: %s (%v), want %v", event.Value("seq"), recomputed, err, event.Value("hash"))
		}
	}
}

func TestTheProductsTreeHeadsVerifyOrNotAsTheVectorsSay(t *testing.T) {
	heads := vectors.Objects(t, vectors.Load(t, "product.json"), "tree_heads")
	for _, head := range heads {
		name, _ := head.String("name")
		message, err := treeHeadMessage(head.Value("tree_size"), head.Value("root_hash"), head.Value("signed_at"))
		// A head whose root was changed after signing has no message of its own (null).
		if err != nil || (head.Value("message") != nil && string(message) != head.Value("message")) {
			t.Errorf("%s: message %s (%v), want %v", name, message, err, head.Value("message"))
		}
		key, _ := head.String("public_key")
		if got := signatureValid(key, head.Value("signature"), message); got != (head.Value("valid") == true) {
			t.Errorf("%s: signature valid %v", name, got)
		}
	}
}

func TestTheIdempotencyKeysAreTheSHA256OfTaskStepAndTool(t *testing.T) {
	for _, vector := range vectors.Objects(t, vectors.Load(t, "product.json"), "idempotency_keys") {
		text := fmt.Sprintf("%s:%s:%s", pyStr(vector.Value("task_id")), pyStr(vector.Value("step")),
			pyStr(vector.Value("tool")))
		digest := sha256.Sum256([]byte(text))
		if got := hex.EncodeToString(digest[:]); got != vector.Value("idempotency_key") {
			t.Errorf("%s: %s, want %v", text, got, vector.Value("idempotency_key"))
		}
	}
}

// What each tampered bundle's refusal says, by the part of the bundle that fails.
var bundleProblems = map[string]string{
	"event_hash": "content hashes to",
	"audit_path": "audit path does not lead",
	"signature":  "not signed by a trusted key",
}

func TestTheInclusionProofBundlesCheckOrFailWhereTheVectorsSay(t *testing.T) {
	file := vectors.Load(t, "merkle.json")
	key, _ := file.String("public_key")
	trusted := map[string]bool{key: true}
	bundles := vectors.Objects(t, file, "proof_bundles")
	if len(bundles) < 2 {
		t.Fatalf("%d bundles", len(bundles))
	}
	for _, vector := range bundles {
		name, _ := vector.String("name")
		verdict, err := CheckProofBundle(vector.Value("bundle"), trusted)
		if vector.Value("valid") == true {
			if err != nil || !strings.HasPrefix(verdict, "OK: event ") {
				t.Errorf("%s: %v", name, err)
			}
			continue
		}
		fails, _ := vector.String("fails")
		want, known := bundleProblems[fails]
		if !known || err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s (fails %s): %q, %v", name, fails, verdict, err)
		}
	}
}
