// The work of the test agents (crash-agent.mjs, replay-agent.mjs), written once with the client as
// an agent would be: a decision, a model call, a tool call through the proxy, completion. Each
// step is decided once across attempts; `hooks.afterToolAnswered` lets the crash agent die there.
import { ToolCallFailed, usageFromOpenAI } from "../../dist/index.js";

export const MODEL = "gpt-test";
export const TOOL = "send-email";
export const STEPS = { decide: 1, draft: 2, send: 3, summary: 4 };

/** A model stand-in: deterministic, answered like OpenAI's Chat Completions. */
function askModel(prompt) {
  const text = prompt.map((message) => message.content).join(" ");
  const response = { choices: [{ message: { content: JSON.stringify({ subject: `Re: ${text.slice(0, 40)}` }) } }],
    usage: { prompt_tokens: 40, completion_tokens: 12, prompt_tokens_details: { cached_tokens: 8 } } };
  return { output: JSON.parse(response.choices[0].message.content), usage: usageFromOpenAI(response) };
}

/** The agent function: what production runs, and what a replay runs again. */
export async function work(session, { toolUrl, template = "Write to {to}", report = () => {}, hooks = {} }) {
  await session.reason(STEPS.decide, { decision: "write and send the e-mail" });
  const prompt = [{ role: "system", content: "You write short e-mails." },
    { role: "user", content: template.replace("{to}", session.input.to) }];
  const draft = await session.modelCall(STEPS.draft, MODEL, prompt, (p) => {
    report("model-asked", { step: STEPS.draft });
    return askModel(p);
  }, { provider: "openai" });
  const call = await session.callTool(STEPS.send, TOOL, { to: session.input.to, subject: draft.subject },
    async (effectKey, input, { signal }) => {
      report("tool-requested", { key: effectKey });
      const answer = await fetch(`${toolUrl}/${TOOL}`, { method: "POST", body: JSON.stringify(input), signal,
        headers: { "Content-Type": "application/json", "Idempotency-Key": effectKey } });
      const result = await answer.json();
      if (answer.status >= 400 && answer.status < 500) throw new ToolCallFailed(result);
      if (!answer.ok) throw new Error(`${TOOL} answered ${answer.status}`); // in flight: the next attempt asks again
      report("tool-answered", { key: effectKey });
      await hooks.afterToolAnswered?.();
      return result;
    });
  report("tool-recorded", { key: call.key, status: call.status, needed: call.needed, replayed: call.replayed });
  await hooks.afterToolRecorded?.();
  if (call.status === "failed") return session.fail(`${TOOL} refused`, { retryable: false });
  return session.complete({ email: call.result, subject: draft.subject },
    { reasoning: { step: STEPS.summary, summary: "sent" } });
}
