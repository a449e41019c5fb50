package audit

import (
	"fmt"
	"strings"

	"github.com/agent-backplane/verifier/jcs"
)

// Step 6 (docs/approvals.md): a tool call dispatched under an approval (ToolCallDispatched
// naming an approval_id) must follow that approval's ApprovalGranted in its task's chain, for
// the same step and tool, with an input whose canonical SHA-256 is the approved argument_sha256.
const (
	approvalRequested  = "ApprovalRequested"
	approvalGranted    = "ApprovalGranted"
	toolCallDispatched = "ToolCallDispatched"
)

// GatedCall is a tool call made under an approval, as its chain proves it.
type GatedCall struct {
	TaskID         string
	Step, Tool     any
	ApprovalID     string
	ArgumentSHA256 string
	Policy         string
	ApprovedBy     []string
	RequestedHash  string // empty when the request is before the export's first event
	GrantedHash    string
	DispatchedHash string
}

func (c GatedCall) String() string {
	approvers := strings.Join(c.ApprovedBy, ", ")
	if approvers == "" {
		approvers = "nobody"
	}
	requested := c.RequestedHash
	if requested == "" {
		requested = "(before this export)"
	}
	return fmt.Sprintf("gated call: task %s step %s %s: approval %s (policy %s) by %s; arguments sha256 %s; "+
		"events requested %s, granted %s, dispatched %s", c.TaskID, pyStr(c.Step), pyStr(c.Tool), c.ApprovalID,
		c.Policy, approvers, c.ArgumentSHA256, requested, c.GrantedHash, c.DispatchedHash)
}

type approvalKey struct{ taskID, approvalID string }

type grant struct {
	payload *jcs.Object
	hash    string
}

// GatedCalls holds the approvals seen so far, by task and approval id, and the calls checked.
type GatedCalls struct {
	requested map[approvalKey]string
	granted   map[approvalKey]grant
	Calls     []GatedCall
}

func newGatedCalls() *GatedCalls {
	return &GatedCalls{requested: map[approvalKey]string{}, granted: map[approvalKey]grant{}}
}

// Summary is the line the report gives the gated calls.
func (g *GatedCalls) Summary() string {
	return fmt.Sprintf("%d gated tool call(s), each made after its approval and with the arguments approved",
		len(g.Calls))
}

// see takes one event whose chain link has been checked, with its recomputed hash.
func (g *GatedCalls) see(event *jcs.Object, recomputed, at string) *Problem {
	payload, ok := event.Object("payload")
	if !ok {
		return nil
	}
	taskID, _ := event.String("task_id")
	approvalID, ok := payload.String("approval_id")
	if !ok {
		return nil
	}
	key := approvalKey{taskID, approvalID}
	switch event.Value("type") {
	case approvalRequested:
		g.requested[key] = recomputed
	case approvalGranted:
		g.granted[key] = grant{payload: payload, hash: recomputed}
	case toolCallDispatched:
		return g.checkCall(event, payload, recomputed, key, at)
	}
	return nil
}

func (g *GatedCalls) checkCall(event, payload *jcs.Object, recomputed string, key approvalKey, at string) *Problem {
	where := fmt.Sprintf("%s: task %s seq %s: the tool call dispatched under approval %s", at, key.taskID,
		pyStr(event.Value("seq")), key.approvalID)
	found, ok := g.granted[key]
	if !ok {
		return problemf("%s has no ApprovalGranted before it in its chain", where)
	}
	approved := found.payload
	if !pyEqual(approved.Value("step"), payload.Value("step")) || !pyEqual(approved.Value("tool"), payload.Value("tool")) {
		return problemf("%s is not the step and tool that were approved", where)
	}
	digest, err := jcs.SHA256Hex(payload.Value("input"))
	if err != nil {
		return problemf("%s: its input cannot be canonicalised (%v)", where, err)
	}
	if digest != approved.Value("argument_sha256") {
		return problemf("%s was made with arguments whose SHA-256 is %s, not the approved %s", where, digest,
			pyStr(approved.Value("argument_sha256")))
	}
	var approvers []string
	if list, ok := approved.Value("approved_by").([]any); ok {
		for _, item := range list {
			if approval, ok := item.(*jcs.Object); ok {
				approvers = append(approvers, pyStr(approval.Value("by")))
			}
		}
	}
	g.Calls = append(g.Calls, GatedCall{
		TaskID: key.taskID, Step: payload.Value("step"), Tool: payload.Value("tool"), ApprovalID: key.approvalID,
		ArgumentSHA256: digest,
		Policy:         fmt.Sprintf("#%s v%s", pyStr(approved.Value("policy_id")), pyStr(approved.Value("policy_version"))),
		ApprovedBy:     approvers, RequestedHash: g.requested[key], GrantedHash: found.hash, DispatchedHash: recomputed,
	})
	return nil
}
