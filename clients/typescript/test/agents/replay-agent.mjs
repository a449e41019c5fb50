// Replays a finished task with the TypeScript client's `replay` and prints the ReplayResult as
// one JSON line (tests/e2e/test_typescript_client.py). REPLAY_TEMPLATE changes the prompt;
// REPLAY_TOOL_ANSWERS (JSON) edits the record the sandbox is answered from.
import { AgentClient, replay } from "../../dist/index.js";
import { work } from "./outreach.mjs";

const [sourceTaskId] = process.argv.slice(2);
const bp = new AgentClient(process.env.BACKPLANE_URL, process.env.BACKPLANE_TOKEN);
const asked = [];
const result = await replay(bp, sourceTaskId,
  (session) => work(session, { toolUrl: process.env.TOOL_URL, template: process.env.REPLAY_TEMPLATE || undefined,
    report: (event) => asked.push(event) }),
  { toolAnswers: process.env.REPLAY_TOOL_ANSWERS ? JSON.parse(process.env.REPLAY_TOOL_ANSWERS) : undefined });
console.log(JSON.stringify({ sandbox_task_id: result.sandboxTaskId, drifted: result.drifted,
  first_divergence: result.firstDivergence, counts: result.counts, asked,
  error: result.error === null ? null : { name: result.error.name, message: result.error.message } }));
