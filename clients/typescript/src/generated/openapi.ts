/**
 * The REST contract's types, generated from docs/openapi.yaml by openapi-typescript
 * (clients/typescript/scripts/openapi-types.mjs). Do not edit: run `npm run generate`.
 */

export interface paths {
    "/api/v1/approvals/": {
        parameters: {
            query?: never;
            header?: never;
            path?: never;
            cookie?: never;
        };
        /**
         * Approval requests, the longest waiting first
         * @description Staff only: the pending ones by default, or those of `status`; a staff user scoped to a namespace sees its requests only.
         */
        get: operations["approvals_list"];
        put?: never;
        post?: never;
        delete?: never;
        options?: never;
        head?: never;
        patch?: never;
        trace?: never;
    };
    "/api/v1/approvals/{approval_id}/": {
        parameters: {
            query?: never;
            header?: never;
            path?: never;
            cookie?: never;
        };
        /**
         * One approval request, waiting for its decision if asked to
         * @description A gated tool call's request (`tasks_tool_calls_dispatch` answered `202 awaiting_approval`), for a task of the caller's namespace: its arguments and their canonical hash, the policy version, the group asked, the decisions so far and its `status`: `pending`, `granted` (dispatch the call again, with the same arguments: it is made), `denied` or `expired` (the dispatch is then `409 approval_denied` or `409 approval_expired`). With `wait` (seconds, at most 30) an agent's request is answered as soon as the status changes, or after `wait` seconds with the request as it is; the wait holds no thread and no database connection. Staff get the answer at once.
         */
        get: operations["approvals_read"];
        put?: never;
        post?: never;
        delete?: never;
        options?: never;
        head?: never;
        patch?: never;
        trace?: never;
    };
    "/api/v1/approvals/{approval_id}/approve/": {
        parameters: {
            query?: never;
            header?: never;
            path?: never;
            cookie?: never;
        };
        get?: never;
        put?: never;
        /**
         * Approve a gated tool call
         * @description A person signed in (a session; agents' tokens are `403`), a member of the group the request asks now, decides once, with a reason; where the policy asks for four eyes, not the person the requesting agent acts for (`403`). A denial ends the request; the approvals the policy requires grant it. Either end is written into the task's chain (`ApprovalDenied`, `ApprovalGranted`: who, why, the arguments' hash and the policy version) with a message on `backplane.approvals`. A request already decided or past its time is `409 already_decided`.
         */
        post: operations["approvals_approve"];
        delete?: never;
        options?: never;
        head?: never;
        patch?: never;
        trace?: never;
    };
    "/api/v1/approvals/{approval_id}/deny/": {
        parameters: {
            query?: never;
            header?: never;
            path?: never;
            cookie?: never;
        };
        get?: never;
        put?: never;
        /**
         * Deny a gated tool call
         * @description A person signed in (a session; agents' tokens are `403`), a member of the group the request asks now, decides once, with a reason; where the policy asks for four eyes, not the person the requesting agent acts for (`403`). A denial ends the request; the approvals the policy requires grant it. Either end is written into the task's chain (`ApprovalDenied`, `ApprovalGranted`: who, why, the arguments' hash and the policy version) with a message on `backplane.approvals`. A request already decided or past its time is `409 already_decided`.
         */
        post: operations["approvals_deny"];
        delete?: never;
        options?: never;
        head?: never;
        patch?: never;
        trace?: never;
    };
    "/api/v1/budgets/": {
        parameters: {
            query?: never;
            header?: never;
            path?: never;
            cookie?: never;
        };
        /**
         * Every budget with its spend this period
         * @description Staff only. Spend is read from the cost rollups, which always equal the sum of the events.
         */
        get: operations["budgets_list"];
        put?: never;
        /**
         * Set a budget (create, raise or lower it)
         * @description Staff only; recorded as a decision with its reason. A namespace or agent budget is per UTC day, a task budget (key: a root task's id) is for the whole tree, sub-agents included. Reaching 80 % and 95 % writes a `BudgetWarning` into the log of the task whose model call crossed, with an outbox message on `backplane.budgets`; reaching 100 % a `BudgetExceeded`, and from then on leases, new tool calls and model-call records of the scope are `409 budget_exceeded` until the limit is raised above the spend or the scope is resumed (`budgets_resume`). docs/costs.md says how far a scope can overshoot.
         */
        post: operations["budgets_set"];
        delete?: never;
        options?: never;
        head?: never;
        patch?: never;
        trace?: never;
    };
    "/api/v1/budgets/{budget_id}/ask/approve/": {
        parameters: {
            query?: never;
            header?: never;
            path?: never;
            cookie?: never;
        };
        get?: never;
        put?: never;
        /**
         * Let a spent budget's scope go on, as it asks
         * @description A person signed in (a session; agents' tokens are `403`), a member of the group the spent budget asks, answers its question for this period with a reason: approving resumes the scope for the rest of the period (a `resume` decision), denying leaves it stopped (a `refuse` decision). Anyone else is `403`; a question answered already is `409 already_decided`; `404` when the budget asks nothing this period.
         */
        post: operations["budgets_ask_approve"];
        delete?: never;
        options?: never;
        head?: never;
        patch?: never;
        trace?: never;
    };
    "/api/v1/budgets/{budget_id}/ask/deny/": {
        parameters: {
            query?: never;
            header?: never;
            path?: never;
            cookie?: never;
        };
        get?: never;
        put?: never;
        /**
         * Keep a spent budget's scope stopped
         * @description A person signed in (a session; agents' tokens are `403`), a member of the group the spent budget asks, answers its question for this period with a reason: approving resumes the scope for the rest of the period (a `resume` decision), denying leaves it stopped (a `refuse` decision). Anyone else is `403`; a question answered already is `409 already_decided`; `404` when the budget asks nothing this period.
         */
        post: operations["budgets_ask_deny"];
        delete?: never;
        options?: never;
        head?: never;
        patch?: never;
        trace?: never;
    };
    "/api/v1/budgets/{budget_id}/resume/": {
        parameters: {
            query?: never;
            header?: never;
            path?: never;
            cookie?: never;
        };
        get?: never;
        put?: never;
        /**
         * Let a spent scope go on for the rest of its period
         * @description Staff only; the limit stays as it is; recorded as a decision with its reason.
         */
        post: operations["budgets_resume"];
        delete?: never;
        options?: never;
        head?: never;
        patch?: never;
        trace?: never;
    };
    "/api/v1/dead-letters/": {
        parameters: {
            query?: never;
            header?: never;
            path?: never;
            cookie?: never;
        };
        /**
         * Dead letters waiting for, or past, a reviewer's decision
         * @description Reviewers only (staff with the `review_deadletter` permission, by session or a token bound to that user); agents get 403. Outbox messages and tasks that automation gave up on, oldest first; follow `next` to page.
         */
        get: operations["dead_letters_list"];
        put?: never;
        post?: never;
        delete?: never;
        options?: never;
        head?: never;
        patch?: never;
        trace?: never;
    };
    "/api/v1/dead-letters/{dead_letter_id}/discard/": {
        parameters: {
            query?: never;
            header?: never;
            path?: never;
            cookie?: never;
        };
        get?: never;
        put?: never;
        /**
         * Give up on a dead letter for good
         * @description Reviewers only. Records the decision and writes `DeadLetterDiscarded` where a task is involved; `compensate: true` fails a task for good and runs its declared compensations. Deciding twice is `409 already_decided`.
         */
        post: operations["dead_letters_discard"];
        delete?: never;
        options?: never;
        head?: never;
        patch?: never;
        trace?: never;
    };
    "/api/v1/dead-letters/{dead_letter_id}/requeue/": {
        parameters: {
            query?: never;
            header?: never;
            path?: never;
            cookie?: never;
        };
        get?: never;
        put?: never;
        /**
         * Send a dead letter back to work
         * @description Reviewers only. The message or task goes back to work (optionally with an edited `payload`), and a task involved gets `DeadLetterRequeued` in its log. Deciding twice is `409 already_decided`.
         */
        post: operations["dead_letters_requeue"];
        delete?: never;
        options?: never;
        head?: never;
        patch?: never;
        trace?: never;
    };
    "/api/v1/events/{position}/proof/": {
        parameters: {
            query?: never;
            header?: never;
            path?: never;
            cookie?: never;
        };
        /**
         * RFC 6962 inclusion proof of an event in a signed tree
         * @description The audit path from the event's leaf (SHA-256 of 0x00 and the hash's 32 bytes) to the root of a signed tree, verifiable as RFC 9162 says. The event must belong to the caller's namespace.
         */
        get: operations["events_inclusion_proof"];
        put?: never;
        post?: never;
        delete?: never;
        options?: never;
        head?: never;
        patch?: never;
        trace?: never;
    };
    "/api/v1/jobs/": {
        parameters: {
            query?: never;
            header?: never;
            path?: never;
            cookie?: never;
        };
        /**
         * Bulk jobs, newest first
         * @description Reviewers only (staff with the `review_deadletter` permission, by session or a token bound to that user); others get 403 and nothing changes. Every job with its counts and decisions; follow `next` to page.
         */
        get: operations["jobs_list"];
        put?: never;
        /**
         * Dry run a bulk action: freeze the selection into a draft job
         * @description Reviewers only (staff with the `review_deadletter` permission, by session or a token bound to that user); others get 403 and nothing changes. The selection (a `filter` or `ids`) is frozen into the job's list: its `total`, its `selection_hash` (SHA-256 of the targets in order, one a line) and a `sample` of the first 20 items, each with what will happen to it (`planned`). Nothing is done until `POST /jobs/{id}/start/` names that hash. Actions: `cancel`, `retry` (a failed task gets `TaskRetried`, a dead-lettered one has its dead letter requeued), `fork_from_failure`, `dead_letter_requeue`, `dead_letter_discard`. An empty selection, a filter that matches nothing or more than `BACKPLANE_BULK_MAX_ITEMS` items is 400 and writes nothing.
         */
        post: operations["jobs_create"];
        delete?: never;
        options?: never;
        head?: never;
        patch?: never;
        trace?: never;
    };
    "/api/v1/jobs/{job_id}/": {
        parameters: {
            query?: never;
            header?: never;
            path?: never;
            cookie?: never;
        };
        /**
         * A bulk job: its status, counts and decisions
         * @description Reviewers only (staff with the `review_deadletter` permission, by session or a token bound to that user); others get 403 and nothing changes. `pending` is what is left; the items themselves are at `/jobs/{id}/items/`.
         */
        get: operations["jobs_get"];
        put?: never;
        post?: never;
        delete?: never;
        options?: never;
        head?: never;
        patch?: never;
        trace?: never;
    };
    "/api/v1/jobs/{job_id}/abort/": {
        parameters: {
            query?: never;
            header?: never;
            path?: never;
            cookie?: never;
        };
        get?: never;
        put?: never;
        /**
         * Abort a job for good
         * @description Reviewers only (staff with the `review_deadletter` permission, by session or a token bound to that user); others get 403 and nothing changes. A draft, running or paused job stops for good: the chunk in flight finishes, pending items stay pending. A finished or aborted job is `409 job_conflict`.
         */
        post: operations["jobs_abort"];
        delete?: never;
        options?: never;
        head?: never;
        patch?: never;
        trace?: never;
    };
    "/api/v1/jobs/{job_id}/items/": {
        parameters: {
            query?: never;
            header?: never;
            path?: never;
            cookie?: never;
        };
        /**
         * A bulk job's items and their results
         * @description Reviewers only (staff with the `review_deadletter` permission, by session or a token bound to that user); others get 403 and nothing changes. The frozen list in order, each item with what was planned and what happened (`done`, `skipped` and why, `failed` and the error); follow `next` to page.
         */
        get: operations["jobs_items"];
        put?: never;
        post?: never;
        delete?: never;
        options?: never;
        head?: never;
        patch?: never;
        trace?: never;
    };
    "/api/v1/jobs/{job_id}/pause/": {
        parameters: {
            query?: never;
            header?: never;
            path?: never;
            cookie?: never;
        };
        get?: never;
        put?: never;
        /**
         * Pause a running job
         * @description Reviewers only (staff with the `review_deadletter` permission, by session or a token bound to that user); others get 403 and nothing changes. Running -> paused, with who and why: the chunk in flight finishes and no other starts. Any other state is `409 job_conflict`.
         */
        post: operations["jobs_pause"];
        delete?: never;
        options?: never;
        head?: never;
        patch?: never;
        trace?: never;
    };
    "/api/v1/jobs/{job_id}/resume/": {
        parameters: {
            query?: never;
            header?: never;
            path?: never;
            cookie?: never;
        };
        get?: never;
        put?: never;
        /**
         * Resume a paused job
         * @description Reviewers only (staff with the `review_deadletter` permission, by session or a token bound to that user); others get 403 and nothing changes. Paused -> running, at the first pending item. Any other state is `409 job_conflict`.
         */
        post: operations["jobs_resume"];
        delete?: never;
        options?: never;
        head?: never;
        patch?: never;
        trace?: never;
    };
    "/api/v1/jobs/{job_id}/retry-failed/": {
        parameters: {
            query?: never;
            header?: never;
            path?: never;
            cookie?: never;
        };
        get?: never;
        put?: never;
        /**
         * A new draft job over a job's failed items
         * @description Reviewers only (staff with the `review_deadletter` permission, by session or a token bound to that user); others get 403 and nothing changes. Dry runs the same action over the items that failed, in their order, as a new draft job (`retry_of` names this one) to start like any other. No failed item is 400.
         */
        post: operations["jobs_retry_failed"];
        delete?: never;
        options?: never;
        head?: never;
        patch?: never;
        trace?: never;
    };
    "/api/v1/jobs/{job_id}/start/": {
        parameters: {
            query?: never;
            header?: never;
            path?: never;
            cookie?: never;
        };
        get?: never;
        put?: never;
        /**
         * Start a draft job
         * @description Reviewers only (staff with the `review_deadletter` permission, by session or a token bound to that user); others get 403 and nothing changes. Draft -> running: the worker executes the frozen list in chunks at the job's rate. `selection_hash` must be the dry run's; otherwise, or when the job is not a draft (started twice), `409 job_conflict` with the job's status and hash.
         */
        post: operations["jobs_start"];
        delete?: never;
        options?: never;
        head?: never;
        patch?: never;
        trace?: never;
    };
    "/api/v1/leases/": {
        parameters: {
            query?: never;
            header?: never;
            path?: never;
            cookie?: never;
        };
        get?: never;
        put?: never;
        /**
         * Claim the oldest pending task of some kinds under a lease
         * @description Agents only. Takes the oldest `pending` task of the given kinds (default: every kind the agent may claim) in the agent's namespace, leases it for `lease_seconds` (default 30, 1-3600) and writes `TaskClaimed`. Send the returned `lease_epoch` with every write to the task, heartbeat before `expires_at`, and finish with `TaskCompleted` or `TaskFailed` (see the append operation). `recovered` is true when an earlier attempt stalled or failed: read `recovery-context` first. `204` with no body when nothing is pending.
         *
         *     With `task_id`, claims that very task if it is `pending` and of a kind the agent may claim (`204` otherwise): how a sandbox replay runs its sandbox fork, which is never handed out by kind.
         */
        post: operations["leases_claim"];
        delete?: never;
        options?: never;
        head?: never;
        patch?: never;
        trace?: never;
    };
    "/api/v1/pauses/": {
        parameters: {
            query?: never;
            header?: never;
            path?: never;
            cookie?: never;
        };
        /**
         * The pauses in force, and the recently lifted ones
         * @description Staff only. A pause in force holds back the pending work of its namespace (no `kind`) or of one kind in it: claims pass over it; leases already held run on.
         */
        get: operations["pauses_list"];
        put?: never;
        /**
         * Pause a namespace, or one kind of it
         * @description Staff only; agents get `403`. From now on claims (`leases_claim`, with or without `task_id`) pass over the scope's pending tasks; running leases finish normally, and the task page says which pause holds a pending task back. One pause in force per scope: a second is `409 pause_in_force`, naming the first. Lift it with `pauses_resume`.
         */
        post: operations["pauses_set"];
        delete?: never;
        options?: never;
        head?: never;
        patch?: never;
        trace?: never;
    };
    "/api/v1/pauses/{pause_id}/resume/": {
        parameters: {
            query?: never;
            header?: never;
            path?: never;
            cookie?: never;
        };
        get?: never;
        put?: never;
        /**
         * Lift a pause: its work is claimed again
         * @description Staff only; recorded on the pause with who and why. A pause lifted before is `409 already_decided`.
         */
        post: operations["pauses_resume"];
        delete?: never;
        options?: never;
        head?: never;
        patch?: never;
        trace?: never;
    };
    "/api/v1/personal-data/erase/": {
        parameters: {
            query?: never;
            header?: never;
            path?: never;
            cookie?: never;
        };
        get?: never;
        put?: never;
        /**
         * Erase a data subject
         * @description People with the `erase_subject` permission (Privacy officers), by session or a token bound to one (a privacy tool). The subject's key is destroyed: every value sealed for it, in the log, exports, backups and delivered messages, can no longer be opened, while every chain, seal and proof still verifies. A `SubjectErased` message goes out on `backplane.privacy`. An unknown subject is 404; an erased one `409 subject_erased`; neither changes anything.
         */
        post: operations["personal_data_erase"];
        delete?: never;
        options?: never;
        head?: never;
        patch?: never;
        trace?: never;
    };
    "/api/v1/personal-data/lookup/": {
        parameters: {
            query?: never;
            header?: never;
            path?: never;
            cookie?: never;
        };
        get?: never;
        put?: never;
        /**
         * Which data subjects a value marked for lookup belongs to
         * @description Exact match through a blind index (a keyed hash, never the value) of the values marked with `lookup: true`; erased subjects are never found. Who may: as for opening; a person's lookup is recorded as a read.
         */
        post: operations["personal_data_lookup"];
        delete?: never;
        options?: never;
        head?: never;
        patch?: never;
        trace?: never;
    };
    "/api/v1/personal-data/open/": {
        parameters: {
            query?: never;
            header?: never;
            path?: never;
            cookie?: never;
        };
        get?: never;
        put?: never;
        /**
         * Open sealed personal values
         * @description Agents open their namespace's envelopes; people need the `open_personal_data` permission (Privacy officers), and every read by a person (or a token bound to one) is recorded: who, which subjects, when. An envelope of an erased subject answers as erased; one of another namespace, or altered, is 400.
         */
        post: operations["personal_data_open"];
        delete?: never;
        options?: never;
        head?: never;
        patch?: never;
        trace?: never;
    };
    "/api/v1/seals/consistency/": {
        parameters: {
            query?: never;
            header?: never;
            path?: never;
            cookie?: never;
        };
        /**
         * RFC 6962 consistency proof between two signed tree sizes
         * @description Proves that the tree of size `first` is a prefix of the tree of size `second` (RFC 9162).
         */
        get: operations["seals_consistency_proof"];
        put?: never;
        post?: never;
        delete?: never;
        options?: never;
        head?: never;
        patch?: never;
        trace?: never;
    };
    "/api/v1/seals/latest/": {
        parameters: {
            query?: never;
            header?: never;
            path?: never;
            cookie?: never;
        };
        /**
         * The latest signed tree head
         * @description The RFC 6962 Merkle tree over every event's hash, as last sealed: its size, root and an Ed25519 signature over the RFC 8785 JSON of `{tree_size, root_hash, signed_at}`. 404 before the first seal.
         */
        get: operations["seals_latest"];
        put?: never;
        post?: never;
        delete?: never;
        options?: never;
        head?: never;
        patch?: never;
        trace?: never;
    };
    "/api/v1/signal-callbacks/{token}/": {
        parameters: {
            query?: never;
            header?: never;
            path?: never;
            cookie?: never;
        };
        get?: never;
        put?: never;
        /**
         * Send a signal with its callback token
         * @description For whoever the waiting agent handed the wait's `callback_url` to (a job it started, a webhook of another system): no account and no header, the token in the path is good for this one signal of this one task. `201` and `SignalReceived` (sent by `callback:<the agent that waited>`); the same payload again is `200`; another payload, or a wait that ran out, is `409 already_decided`; a closed task `409 task_closed`. A token that is not one of the server's is `404`; past 10 sends a minute for one signal, `429`.
         */
        post: operations["signal_callbacks_send"];
        delete?: never;
        options?: never;
        head?: never;
        patch?: never;
        trace?: never;
    };
    "/api/v1/tasks/": {
        parameters: {
            query?: never;
            header?: never;
            path?: never;
            cookie?: never;
        };
        /**
         * List tasks of the caller's namespace, oldest first
         * @description The caller's namespace only (staff sessions see every namespace). Keyset pagination: follow `next` until it is null; a page never repeats or skips a task created meanwhile.
         */
        get: operations["tasks_list"];
        put?: never;
        /**
         * Create a task (idempotent on task_id)
         * @description Creates a `pending` task in the caller's namespace with event 1 `TaskStarted`. Send your own `task_id` (a random UUID, e.g. uuid4) to make the create safe to retry: the same `task_id` with the same `kind` and `input` again is `200` with the same Task and `Idempotent-Replay: true`, and writes nothing.
         *
         *     Task ids are global UUIDs, unique across namespaces. A `task_id` that is already used, with other content in your namespace or with any content in another one, is `409 task_exists` with one and the same message and details in every case: the answer never says whether the id is used elsewhere, by whom, or with what content, and an identical create from another namespace is not a replay of that namespace's task. Pick a new UUID and create again. (An unused id cannot answer like a used one: the id is the task's key.)
         *
         *     `parent_task_id` must name a task of your namespace; `max_attempts` defaults to the server's setting (3); `metadata` is stored with `TaskStarted` and not interpreted.
         */
        post: operations["tasks_create"];
        delete?: never;
        options?: never;
        head?: never;
        patch?: never;
        trace?: never;
    };
    "/api/v1/tasks/{task_id}/": {
        parameters: {
            query?: never;
            header?: never;
            path?: never;
            cookie?: never;
        };
        /**
         * One task
         * @description The task's current state, the projection of its event log. Another namespace's task is 404.
         */
        get: operations["tasks_retrieve"];
        put?: never;
        post?: never;
        delete?: never;
        options?: never;
        head?: never;
        patch?: never;
        trace?: never;
    };
    "/api/v1/tasks/{task_id}/cancel/": {
        parameters: {
            query?: never;
            header?: never;
            path?: never;
            cookie?: never;
        };
        get?: never;
        put?: never;
        /**
         * Cancel a task: it is closed, its lease holder's next write is refused
         * @description Writes `TaskCancelled` (who, why, whether to compensate) into the task's log: the task becomes `cancelled`, a closed status, and loses its lease. Its holder's next append, tool call, heartbeat or release is `409 task_closed` whose details name the cancellation (`cancelled_by`, `reason`, `cancelled_at`), so a cooperative agent stops at its next step. `compensate: true` starts the task's saga as a terminal failure does: `compensating` while compensations are due, then `compensated`. A cancelled sub-task reports to its parent like a failed one (`SubAgentResultReceived` with status `cancelled`).
         *
         *     Staff sessions cancel in any namespace; an agent cancels its own namespace's tasks (another namespace's task is `404`). A task that has already finished is `409 task_closed` naming its status, and its cancellation if it was cancelled.
         */
        post: operations["tasks_cancel"];
        delete?: never;
        options?: never;
        head?: never;
        patch?: never;
        trace?: never;
    };
    "/api/v1/tasks/{task_id}/diff/{other_id}/": {
        parameters: {
            query?: never;
            header?: never;
            path?: never;
            cookie?: never;
        };
        /**
         * Where two tasks' histories drift apart
         * @description Compares the histories of two tasks of the caller's namespace (a source and its fork, two attempts, two replays), each read through its sources as its recovery context is. Events are aligned by type and step (and tool or sub-agent kind) and compared on type and payload, leaving out what differs between any two runs by construction (keys, lease epochs and deadlines, agent names, task ids) and the forks' `TaskForked` markers. `first_divergence` is the first aligned pair that differs: the event on each side (null on the side that has none), the JSON path of the first differing field and the two values there; `counts` sums the aligned pairs by kind.
         */
        get: operations["tasks_diff"];
        put?: never;
        post?: never;
        delete?: never;
        options?: never;
        head?: never;
        patch?: never;
        trace?: never;
    };
    "/api/v1/tasks/{task_id}/events/": {
        parameters: {
            query?: never;
            header?: never;
            path?: never;
            cookie?: never;
        };
        /**
         * A task's events in seq order
         * @description Events with `seq` greater than `after_seq`, oldest first. Page on with `after_seq` = `next_after_seq` until it is null. Each event's `hash` can be checked as docs/api.md describes.
         */
        get: operations["tasks_events_list"];
        put?: never;
        /**
         * Append one event
         * @description Appends one event to the task's log and answers it with its `seq`, `position` and `hash`.
         *
         *     **Types a client sends.** `ReasoningStepCompleted` (payload needs an integer `step`); `TaskCompleted` (payload needs `output`, an object) finishes the task: `completed`, lease released; `TaskFailed` (payload needs `error`, a string, and `retryable`, a boolean) fails the attempt: with `retryable: true` and attempts left the task goes back to `pending`, otherwise it is `failed` (then `compensating` if compensations are due); and your own PascalCase types matching `^[A-Z][A-Za-z0-9]{2,63}$`. `payload` is required on every event, `{}` when the type needs nothing.
         *
         *     **Reserved**, written only by the server; sending one is `400 validation_error`: `ApprovalDenied`, `ApprovalEscalated`, `ApprovalExpired`, `ApprovalGranted`, `ApprovalRequested`, `BudgetExceeded`, `BudgetWarning`, `CompensationCompleted`, `CompensationRequested`, `CompensationStarted`, `DeadLetterDiscarded`, `DeadLetterRequeued`, `LeaseReleased`, `ProjectionReconciled`, `SignalAwaited`, `SignalReceived`, `SignalTimedOut`, `SubAgentAccepted`, `SubAgentDispatched`, `SubAgentResultReceived`, `TaskCancelled`, `TaskClaimed`, `TaskCompensated`, `TaskDeadLettered`, `TaskForked`, `TaskRetried`, `TaskStalled`, `TaskStarted`, `ToolCallDispatched`, `ToolCallResultReceived`.
         *
         *     `lease_epoch` is required while the task is leased (`409 stale_lease` otherwise or when it is not the current one); `expected_seq` makes the write conditional (`409 seq_conflict` with `details.last_seq`); a completed, failed, dead-lettered or compensated task is `409 task_closed`. The same `idempotency_key` and body again is `200` with the original event and `Idempotent-Replay: true`; the key with another body is `422 idempotency_mismatch`. `outbox` messages (at most 1000) are committed with the event and delivered after it.
         */
        post: operations["tasks_events_append"];
        delete?: never;
        options?: never;
        head?: never;
        patch?: never;
        trace?: never;
    };
    "/api/v1/tasks/{task_id}/events/batch/": {
        parameters: {
            query?: never;
            header?: never;
            path?: never;
            cookie?: never;
        };
        get?: never;
        put?: never;
        /**
         * Append several events, all or nothing
         * @description Up to 1000 events, each as in the single append (`type` and `payload` required, the same client types, the same reserved ones refused), written in one transaction: all of them or none. `expected_seq` and `lease_epoch` apply to the batch. The same batch again (the same idempotency keys and bodies) is `200` with the original events and `Idempotent-Replay: true`. Errors name the event: `details` keys like `events[2].payload`.
         */
        post: operations["tasks_events_batch_append"];
        delete?: never;
        options?: never;
        head?: never;
        patch?: never;
        trace?: never;
    };
    "/api/v1/tasks/{task_id}/fork/": {
        parameters: {
            query?: never;
            header?: never;
            path?: never;
            cookie?: never;
        };
        get?: never;
        put?: never;
        /**
         * Fork a task at any event: a new task that continues its history from there
         * @description Creates a `pending` task of the source's namespace and kind whose log opens with `TaskStarted` (the source's `input`, or the replacement given) and `TaskForked`, naming the source, `at_seq` and the hash of the source's event there. The source's events up to `at_seq` are the fork's history: its recovery context presents them as confirmed, and the tool-call proxy answers the fork's calls of those steps from the source's record (one side effect across a source and all its forks). The source is never written. Closed sources (failed, dead-lettered) fork like any other; forks of forks work.
         *
         *     `sandbox: true` makes a fork for replaying an agent against the record: tool calls and sub-agents are answered only from the source's record (`tool_answers` edits that record for the replay), it sends no message, fleet agents never claim it (claim it with `task_id` on `leases_claim`), and it can only be forked into another sandbox (`409 sandbox_refused`).
         *
         *     Idempotent on `task_id` like a create: the same fork again is `200` with the same task; that id for anything else is `409 task_exists`. `at_seq` outside 1..`last_seq` is `400`; another namespace's task is `404`. Agents fork within their namespace; staff sessions in any.
         */
        post: operations["tasks_fork"];
        delete?: never;
        options?: never;
        head?: never;
        patch?: never;
        trace?: never;
    };
    "/api/v1/tasks/{task_id}/heartbeat/": {
        parameters: {
            query?: never;
            header?: never;
            path?: never;
            cookie?: never;
        };
        get?: never;
        put?: never;
        /**
         * Extend the lease
         * @description Moves the live lease's deadline on by its length (no event is written). A heartbeat that arrives after `expires_at` is `409 stale_lease` even if the stall detector has not swept the task yet: so is every write sent with that lease's epoch. Heartbeat at a third of the lease or more often, and claim again after a 409.
         */
        post: operations["tasks_heartbeat"];
        delete?: never;
        options?: never;
        head?: never;
        patch?: never;
        trace?: never;
    };
    "/api/v1/tasks/{task_id}/recovery-context/": {
        parameters: {
            query?: never;
            header?: never;
            path?: never;
            cookie?: never;
        };
        /**
         * What a recovering agent needs to resume (built from the event log)
         * @description For an agent that claimed a task with `recovered: true`: the attempt, the seq to resume from, the completed steps, tool calls (answered and still in flight), sub-tasks, the last reasoning step and a prompt that says where to pick up. Built from the event log only.
         */
        get: operations["tasks_recovery_context"];
        put?: never;
        post?: never;
        delete?: never;
        options?: never;
        head?: never;
        patch?: never;
        trace?: never;
    };
    "/api/v1/tasks/{task_id}/release/": {
        parameters: {
            query?: never;
            header?: never;
            path?: never;
            cookie?: never;
        };
        get?: never;
        put?: never;
        /**
         * Give the task back to pending without counting an attempt
         * @description Ends the caller's lease: the task is `pending` again for any agent, `attempts` unchanged. `409 stale_lease` when `lease_epoch` is not the current lease.
         */
        post: operations["tasks_release"];
        delete?: never;
        options?: never;
        head?: never;
        patch?: never;
        trace?: never;
    };
    "/api/v1/tasks/{task_id}/signals/{name}/": {
        parameters: {
            query?: never;
            header?: never;
            path?: never;
            cookie?: never;
        };
        /**
         * A task's signal, waiting for it if asked to
         * @description The signal `name` of a task of the caller's namespace: `waiting`, `received` (with its `payload` and `sent_by`) or `timed_out`. With `wait` (seconds, at most 30) an agent's request is answered as soon as the status changes, the wait holding no thread and no database connection; staff get the answer at once. `404` when the signal was neither waited for nor sent.
         */
        get: operations["tasks_signals_read"];
        put?: never;
        /**
         * Send a task a named signal
         * @description By an agent of the task's namespace (a webhook or a long-running job can hold such a token) or an operator: `201` and `SignalReceived` (the payload and who sent it) in the task's log, which ends its wait. The same payload again is `200`, the signal as received; another payload, or a signal whose wait ran out, is `409 already_decided`; a closed task is `409 task_closed`.
         */
        post: operations["tasks_signals_send"];
        delete?: never;
        options?: never;
        head?: never;
        patch?: never;
        trace?: never;
    };
    "/api/v1/tasks/{task_id}/signals/{name}/wait/": {
        parameters: {
            query?: never;
            header?: never;
            path?: never;
            cookie?: never;
        };
        get?: never;
        put?: never;
        /**
         * Wait durably for a named signal
         * @description The task's lease holder waits for the signal `name` for at most `timeout_seconds`: `201` and `SignalAwaited` in the task's log. Again (a retry, or the next attempt after a crash): `200`, the signal as it stands. A signal sent before the wait is found by it (`status: received`). While a task waits the stall detector leaves it alone; read the signal with `tasks_signals_read` and `wait`. When the time runs out the signal is `timed_out` (`SignalTimedOut`). `callback_url` sends this one signal with no credentials (`signal_callbacks_send`): hand it to whoever should send it.
         */
        post: operations["tasks_signals_wait"];
        delete?: never;
        options?: never;
        head?: never;
        patch?: never;
        trace?: never;
    };
    "/api/v1/tasks/{task_id}/subtasks/": {
        parameters: {
            query?: never;
            header?: never;
            path?: never;
            cookie?: never;
        };
        get?: never;
        put?: never;
        /**
         * Hand work to a sub-agent: a child task and SubAgentDispatched in the parent
         * @description Creates a child task of `kind` in the parent's namespace and writes `SubAgentDispatched` into the parent's log, in one transaction. The same step and kind again is `200` with the same child. Claiming the child writes `SubAgentAccepted` into the parent; the child's end writes `SubAgentResultReceived` there.
         *
         *     In a fork, a step whose hand-off the source made before the fork point gets the source's child, never a second one: a finished child's result is written into the fork's log at once; an unfinished one is adopted, and its result is written into the fork too when it ends. A sandbox gets recorded children only (`409 sandbox_refused` for a hand-off with no finished child on record).
         */
        post: operations["tasks_subtasks_dispatch"];
        delete?: never;
        options?: never;
        head?: never;
        patch?: never;
        trace?: never;
    };
    "/api/v1/tasks/{task_id}/tool-calls/": {
        parameters: {
            query?: never;
            header?: never;
            path?: never;
            cookie?: never;
        };
        get?: never;
        put?: never;
        /**
         * Record a tool call before making it; a repeat answers from the record
         * @description The idempotency proxy. The key is sha256("{task_id}:{step}:{tool}") in lowercase hex, computed here. First time: `201` with `status: dispatched` and a `ToolCallDispatched` event; make the call with the key as its `Idempotency-Key`, then record the answer with `tool_calls_result`. Again for the same step and tool: `200`, `replayed: true`, with `status` `succeeded` or `failed` and the `result`, or `in_flight` when no answer was recorded. The same key with other `input` is `422 idempotency_mismatch`. `compensation` names the tool call that undoes this one if the task fails for good.
         *
         *     `effect_key` is the key to send the tool as its `Idempotency-Key`. It equals `idempotency_key`, except in a fork (`tasks_fork`) for a step its source dispatched before the fork point: there the call is answered from the source's record (`200`, `replayed: true`), or, when the source never recorded an answer, is `in_flight` under the source's `effect_key`, so the tool sees the same key and acts once across the source and its forks. A sandbox fork answers only from the record: a call with no recorded answer is `409 sandbox_refused`, and nothing is written.
         *
         *     A call a tool policy gates (docs/approvals.md) is not made yet: `202` with `status: awaiting_approval` and its approval request (`ApprovalRequested` in the task's log; `reason` is shown to the people asked). The same dispatch again answers the same request until it is decided (`approvals_read` waits for that); once granted it is made as above, with the same arguments only (other arguments for the step are `422 idempotency_mismatch`); denied or expired, it is `409 approval_denied` or `409 approval_expired`.
         */
        post: operations["tasks_tool_calls_dispatch"];
        delete?: never;
        options?: never;
        head?: never;
        patch?: never;
        trace?: never;
    };
    "/api/v1/tasks/{task_id}/verify/": {
        parameters: {
            query?: never;
            header?: never;
            path?: never;
            cookie?: never;
        };
        /**
         * Check the task's hash chain
         * @description Recomputes every event's hash (RFC 8785 canonical JSON, SHA-256, each covering the one before) and reports whether the chain holds, how many events were checked and the first seq that does not. For a fork, its `TaskForked` (seq 2) must also name the hash its source's event at `at_seq` has.
         */
        get: operations["tasks_verify"];
        put?: never;
        post?: never;
        delete?: never;
        options?: never;
        head?: never;
        patch?: never;
        trace?: never;
    };
    "/api/v1/tool-calls/{key}/": {
        parameters: {
            query?: never;
            header?: never;
            path?: never;
            cookie?: never;
        };
        /**
         * One tool call record
         * @description The record behind an idempotency key, for a task of the caller's namespace.
         */
        get: operations["tool_calls_retrieve"];
        put?: never;
        post?: never;
        delete?: never;
        options?: never;
        head?: never;
        patch?: never;
        trace?: never;
    };
    "/api/v1/tool-calls/{key}/result/": {
        parameters: {
            query?: never;
            header?: never;
            path?: never;
            cookie?: never;
        };
        get?: never;
        put?: never;
        /**
         * Record a tool call's answer once
         * @description Records the answer of a dispatched call and writes `ToolCallResultReceived` to the task: `201`. The identical answer again is `200` (`replayed: true`); a different answer for an answered key is `422 idempotency_mismatch`. The key is the one `tasks_tool_calls_dispatch` returned.
         */
        post: operations["tool_calls_result"];
        delete?: never;
        options?: never;
        head?: never;
        patch?: never;
        trace?: never;
    };
    "/api/v1/tool-policies/": {
        parameters: {
            query?: never;
            header?: never;
            path?: never;
            cookie?: never;
        };
        /**
         * The current version of every tool policy
         * @description Staff only. A namespace's policy shadows the global one (`namespace` null) of the same tool.
         */
        get: operations["tool_policies_list"];
        put?: never;
        /**
         * Set a tool's approval policy: its next version
         * @description Operators only. Writes the next version of the policy of `tool` in `namespace` and makes it the current one; earlier versions stay as they were, and each approval request records the version it was decided under. Everything is checked first, and a refusal changes nothing: a condition that does not parse, uses anything but comparisons joined by `and`, `or`, `not`, or names a field not declared in `field_types` (or declared with an unknown type) is `400` with the reason under `details.condition`; a group that does not exist under `details.approver_group` or `details.escalate_to`. docs/approvals.md describes the condition language.
         */
        post: operations["tool_policies_set"];
        delete?: never;
        options?: never;
        head?: never;
        patch?: never;
        trace?: never;
    };
    "/api/v1/tool-policies/{policy_id}/": {
        parameters: {
            query?: never;
            header?: never;
            path?: never;
            cookie?: never;
        };
        /**
         * One version of a tool policy, current or not
         * @description Staff only. A version is never changed: what an approval request was decided under reads the same later.
         */
        get: operations["tool_policies_read"];
        put?: never;
        post?: never;
        delete?: never;
        options?: never;
        head?: never;
        patch?: never;
        trace?: never;
    };
    "/api/v1/tool-policies/{policy_id}/versions/": {
        parameters: {
            query?: never;
            header?: never;
            path?: never;
            cookie?: never;
        };
        /**
         * Every version of a tool policy, newest first
         * @description Staff only: the versions of the same tool and namespace as the one named, each with who set it and why.
         */
        get: operations["tool_policies_versions_list"];
        put?: never;
        post?: never;
        delete?: never;
        options?: never;
        head?: never;
        patch?: never;
        trace?: never;
    };
    "/api/v1/tools/{name}/invoke/": {
        parameters: {
            query?: never;
            header?: never;
            path?: never;
            cookie?: never;
        };
        get?: never;
        put?: never;
        /**
         * The backplane calls a registered tool with an Idempotency-Key, or answers from the record
         * @description The key is the tool call's: sha256("{task_id}:{step}:{name}"). `ToolCallDispatched` is committed before the tool is called and `ToolCallResultReceived` when it answers; the answer is kept for the tool's TTL and a repeat gets it with `replayed: true` without calling the tool. A 2xx answer is `succeeded` (a body that is not a JSON object comes as `{"value": ...}`), a 4xx refusal is `failed` with `{"status_code", "body"}`. No usable answer (transport error, timeout, 5xx, 408, 429) is `502 tool_unavailable`: the call stays in flight and a retry sends the same key. `503 circuit_open` while the tool's breaker is open and `429 rate_limited` beyond its per-minute limit, both with `Retry-After`, without calling the tool. A call a tool policy gates is `202 awaiting_approval` until people approve it, as `tasks_tool_calls_dispatch` says (docs/approvals.md); once granted, the same invoke calls the tool.
         */
        post: operations["tools_invoke"];
        delete?: never;
        options?: never;
        head?: never;
        patch?: never;
        trace?: never;
    };
}
export type webhooks = Record<string, never>;
export interface components {
    schemas: {
        /**
         * @description * `cancel` - cancel
         *     * `retry` - retry
         *     * `fork_from_failure` - fork_from_failure
         *     * `dead_letter_requeue` - dead_letter_requeue
         *     * `dead_letter_discard` - dead_letter_discard
         * @enum {string}
         */
        ActionEnum: "cancel" | "retry" | "fork_from_failure" | "dead_letter_requeue" | "dead_letter_discard";
        /**
         * @description A tool call's answer, as an agent records it and as the gateway and a sandbox give it.
         * @enum {string}
         */
        AnswerStatusEnum: "failed" | "succeeded";
        ApprovalDecisionOut: {
            by: string;
            verdict: string;
            reason: string;
            /** @description RFC 3339, UTC */
            at: string;
        };
        ApprovalListOut: {
            results: components["schemas"]["ApprovalOut"][];
        };
        ApprovalOut: {
            /** Format: uuid */
            approval_id: string;
            /** Format: uuid */
            task_id: string;
            step: number;
            tool: string;
            idempotency_key: string;
            input: Record<string, unknown>;
            argument_sha256: string;
            reason: string;
            requested_by: string;
            /** @description RFC 3339, UTC */
            requested_at: string;
            policy_id: number;
            policy_version: number;
            status: components["schemas"]["ApprovalStatusEnum"];
            approvals_required: number;
            group: string;
            escalated: boolean;
            /** @description RFC 3339, UTC */
            expires_at: string;
            /** @description RFC 3339, UTC */
            decided_at: string | null;
            decisions: components["schemas"]["ApprovalDecisionOut"][];
        };
        /** @enum {string} */
        ApprovalStatusEnum: "denied" | "expired" | "granted" | "pending";
        /**
         * @description * `stop` - stop
         *     * `ask` - ask
         * @enum {string}
         */
        AtLimitEnum: "stop" | "ask";
        /** @description A gated call's dispatch: not made; its approval request, which the same dispatch finds again. */
        AwaitingApprovalOut: {
            status: components["schemas"]["AwaitingApprovalStatusEnum"];
            /** Format: uuid */
            approval_id: string;
            idempotency_key: string;
            argument_sha256: string;
            policy_id: number;
            policy_version: number;
            group: string;
            approvals_required: number;
            /** @description RFC 3339, UTC */
            expires_at: string;
        };
        /** @enum {string} */
        AwaitingApprovalStatusEnum: "awaiting_approval";
        BudgetAskOut: {
            status: components["schemas"]["BudgetAskOutStatusEnum"];
            group: string;
            spend: string;
            asked_at: string;
            decided_by: string | null;
            reason: string | null;
        };
        /**
         * @description * `pending` - pending
         *     * `granted` - granted
         *     * `denied` - denied
         *     * `expired` - expired
         * @enum {string}
         */
        BudgetAskOutStatusEnum: "pending" | "granted" | "denied" | "expired";
        /** @description Refuses fields it does not know, so a client cannot believe it set seq, namespace or status. */
        BudgetInRequest: {
            scope: components["schemas"]["ScopeEnum"];
            /** @description the namespace; `<namespace>/<agent>`; or a root task's id */
            key: string;
            period: components["schemas"]["PeriodEnum"];
            unit: components["schemas"]["UnitEnum"];
            /** @description with unit `currency`, e.g. USD */
            currency?: string;
            /** Format: decimal */
            limit: string;
            /**
             * @description `stop` (default), or `ask`: ask `ask_group` whether to go on
             *
             *     * `stop` - stop
             *     * `ask` - ask
             * @default stop
             */
            at_limit: components["schemas"]["AtLimitEnum"];
            /** @description with `at_limit` ask: a group's name */
            ask_group?: string;
            reason: string;
        };
        BudgetListOut: {
            results: components["schemas"]["BudgetOut"][];
        };
        BudgetOut: {
            id: number;
            scope: components["schemas"]["ScopeEnum"];
            key: string;
            period: components["schemas"]["PeriodEnum"];
            unit: components["schemas"]["UnitEnum"];
            currency: string | null;
            limit: string;
            spend: string;
            /** @description true: leases, tool calls and model-call records are refused */
            spent: boolean;
            at_limit: components["schemas"]["AtLimitEnum"];
            ask_group: string | null;
            /** @description this period's question to `ask_group`, once the limit was reached */
            ask: components["schemas"]["BudgetAskOut"] | null;
        };
        ChainVerifyOut: {
            valid: boolean;
            checked: number;
            head_hash: string;
            first_invalid_seq: number | null;
        };
        CompensationInRequest: {
            tool: string;
            input: Record<string, unknown>;
        };
        ConsistencyProofOut: {
            first: number;
            second: number;
            proof: string[];
        };
        DeadLetterListOut: {
            results: components["schemas"]["DeadLetterOut"][];
            /** Format: uri */
            next: string | null;
        };
        DeadLetterOut: {
            id: number;
            source: string;
            /** Format: uuid */
            task_id: string | null;
            topic: string;
            payload: {
                [key: string]: unknown;
            };
            error: string;
            attempts: number;
            status: components["schemas"]["DeadLetterOutStatusEnum"];
            created_at: string;
            decided_by: string | null;
            decided_at: string | null;
            reason: string;
            /** @description Outbox dead letters under strict ordering, until decided: how many later messages of the same key and destination wait for this decision (they are delivered after it when it is requeued, without it when it is discarded). 0 otherwise. */
            waiting_behind: number;
        };
        /**
         * @description * `pending` - pending
         *     * `requeued` - requeued
         *     * `discarded` - discarded
         * @enum {string}
         */
        DeadLetterOutStatusEnum: "pending" | "requeued" | "discarded";
        /** @description Refuses fields it does not know, so a client cannot believe it set seq, namespace or status. */
        DecisionInRequest: {
            reason: string;
        };
        DiffCountsOut: {
            same: number;
            changed: number;
            only_in_a: number;
            only_in_b: number;
        };
        DiffSideOut: {
            /** Format: uuid */
            task_id: string;
            seq: number;
            type: string;
        };
        /** @description Refuses fields it does not know, so a client cannot believe it set seq, namespace or status. */
        DiscardInRequest: {
            reason: string;
            /**
             * @description task dead letters: fail the task for good and run its declared compensations
             * @default false
             */
            compensate: boolean;
        };
        DivergenceOut: {
            kind: components["schemas"]["KindEnum"];
            path: string | null;
            a: components["schemas"]["DiffSideOut"] | null;
            b: components["schemas"]["DiffSideOut"] | null;
            a_value: unknown;
            b_value: unknown;
        };
        /** @description Refuses fields it does not know, so a client cannot believe it set seq, namespace or status. */
        EraseInRequest: {
            subject: string;
            reason: string;
            /** @description the namespace whose personal data it is: an agent's own (may be left out), a staff user's scope (may be left out), or any for staff of every namespace (required) */
            namespace?: string;
        };
        ErasedOut: {
            namespace: string;
            subject: string;
            erased_at: string;
            erased_by: string;
            reason: string;
        };
        ErrorDetail: {
            code: string;
            message: string;
            details: {
                [key: string]: unknown;
            };
        };
        ErrorOut: {
            error: components["schemas"]["ErrorDetail"];
        };
        /** @description One event as a client writes it, checked against the task's chain and lease. */
        EventAppendInRequest: {
            /** @description PascalCase, matching ^[A-Z][A-Za-z0-9]{2,63}$. ReasoningStepCompleted needs an integer payload.step, TaskCompleted an object payload.output, TaskFailed a string payload.error and a boolean payload.retryable. Written only by the server, refused with 400 validation_error: ApprovalDenied, ApprovalEscalated, ApprovalExpired, ApprovalGranted, ApprovalRequested, BudgetExceeded, BudgetWarning, CompensationCompleted, CompensationRequested, CompensationStarted, DeadLetterDiscarded, DeadLetterRequeued, LeaseReleased, ProjectionReconciled, SignalAwaited, SignalReceived, SignalTimedOut, SubAgentAccepted, SubAgentDispatched, SubAgentResultReceived, TaskCancelled, TaskClaimed, TaskCompensated, TaskDeadLettered, TaskForked, TaskRetried, TaskStalled, TaskStarted, ToolCallDispatched, ToolCallResultReceived. */
            type: string;
            /** @description required (docs/api.md); `{}` when the type needs nothing */
            payload: Record<string, unknown>;
            idempotency_key?: string | null;
            lamport?: number;
            causation_id?: string | null;
            correlation_id?: string | null;
            trace_id?: string | null;
            outbox?: components["schemas"]["OutboxItemInRequest"][];
            expected_seq?: number;
            lease_epoch?: number;
        };
        /** @description Events appended in one transaction: all of them, or none. */
        EventBatchInRequest: {
            events: components["schemas"]["EventFieldsInRequest"][];
            expected_seq?: number;
            lease_epoch?: number;
        };
        EventBatchOut: {
            results: components["schemas"]["EventOut"][];
        };
        /** @description One event as a client writes it. */
        EventFieldsInRequest: {
            /** @description PascalCase, matching ^[A-Z][A-Za-z0-9]{2,63}$. ReasoningStepCompleted needs an integer payload.step, TaskCompleted an object payload.output, TaskFailed a string payload.error and a boolean payload.retryable. Written only by the server, refused with 400 validation_error: ApprovalDenied, ApprovalEscalated, ApprovalExpired, ApprovalGranted, ApprovalRequested, BudgetExceeded, BudgetWarning, CompensationCompleted, CompensationRequested, CompensationStarted, DeadLetterDiscarded, DeadLetterRequeued, LeaseReleased, ProjectionReconciled, SignalAwaited, SignalReceived, SignalTimedOut, SubAgentAccepted, SubAgentDispatched, SubAgentResultReceived, TaskCancelled, TaskClaimed, TaskCompensated, TaskDeadLettered, TaskForked, TaskRetried, TaskStalled, TaskStarted, ToolCallDispatched, ToolCallResultReceived. */
            type: string;
            /** @description required (docs/api.md); `{}` when the type needs nothing */
            payload: Record<string, unknown>;
            idempotency_key?: string | null;
            lamport?: number;
            causation_id?: string | null;
            correlation_id?: string | null;
            trace_id?: string | null;
            outbox?: components["schemas"]["OutboxItemInRequest"][];
        };
        EventListOut: {
            results: components["schemas"]["EventOut"][];
            next_after_seq: number | null;
        };
        /** @description The Event object of docs/api.md; ``hash`` covers every field but itself and ``position``. */
        EventOut: {
            /** Format: uuid */
            task_id: string;
            seq: number;
            position: number;
            type: string;
            payload: Record<string, unknown>;
            agent: string | null;
            idempotency_key: string | null;
            lamport: number;
            causation_id: string | null;
            correlation_id: string | null;
            trace_id: string | null;
            /** @description RFC 3339, UTC */
            recorded_at: string;
            prev_hash: string;
            hash: string;
        };
        ForkedFromOut: {
            /** Format: uuid */
            task_id: string;
            at_seq: number;
        };
        HeartbeatOut: {
            /** @description RFC 3339, UTC */
            expires_at: string;
        };
        InclusionProofOut: {
            leaf_index: number;
            tree_size: number;
            audit_path: string[];
        };
        /** @description Refuses fields it does not know, so a client cannot believe it set seq, namespace or status. */
        JobCreateInRequest: {
            action: components["schemas"]["ActionEnum"];
            /** @description Task actions: the task list's filter (`q`, `status`, `kind`, `namespace`, `agent`, `created_after`, `created_before`, `updated_after`, `updated_before`, `stalled_since`, `recovered_since`, `replayed_since`, `recovering`, `sandboxes`). Dead-letter actions: `source`, `topic`, `kind`, `error`, `created_after`, `created_before` over pending dead letters. Give `filter` or `ids`, not both. */
            filter?: {
                [key: string]: unknown;
            };
            /** @description task ids (UUIDs) or dead-letter ids (integers), in the order to act */
            ids?: unknown[];
            reason: string;
            /** @description `compensate` (boolean) for cancel and dead_letter_discard */
            options?: {
                [key: string]: unknown;
            };
            /**
             * @description items a second at most; 0: no limit
             * @default 200
             */
            rate_per_second: number;
            /**
             * @description items per transaction
             * @default 200
             */
            chunk_size: number;
        };
        /** @description Refuses fields it does not know, so a client cannot believe it set seq, namespace or status. */
        JobDecisionInRequest: {
            reason: string;
        };
        JobDecisionOut: {
            action: string;
            decided_by: string;
            reason: string;
            at: string;
        };
        JobItemListOut: {
            results: components["schemas"]["JobItemOut"][];
            /** Format: uri */
            next: string | null;
        };
        JobItemOut: {
            index: number;
            /** @description a task's id or a dead letter's id */
            target: string;
            /** @description what the dry run said will happen */
            planned: string;
            status: components["schemas"]["JobItemOutStatusEnum"];
            /** @description what happened, or why it was skipped or failed */
            detail: string;
            finished_at: string | null;
        };
        /**
         * @description * `pending` - pending
         *     * `done` - done
         *     * `skipped` - skipped
         *     * `failed` - failed
         * @enum {string}
         */
        JobItemOutStatusEnum: "pending" | "done" | "skipped" | "failed";
        JobListOut: {
            results: components["schemas"]["JobOut"][];
            /** Format: uri */
            next: string | null;
        };
        JobOut: {
            id: number;
            action: components["schemas"]["ActionEnum"];
            status: components["schemas"]["JobOutStatusEnum"];
            selection: {
                [key: string]: unknown;
            };
            selection_hash: string;
            options: {
                [key: string]: unknown;
            };
            reason: string;
            created_by: string;
            created_at: string;
            retry_of: number | null;
            total: number;
            done: number;
            skipped: number;
            failed: number;
            pending: number;
            rate_per_second: number;
            chunk_size: number;
            started_at: string | null;
            finished_at: string | null;
            decisions: components["schemas"]["JobDecisionOut"][];
            /** @description the dry run's answer: the first 20 items */
            sample?: components["schemas"]["JobItemOut"][];
        };
        /**
         * @description * `draft` - draft
         *     * `running` - running
         *     * `paused` - paused
         *     * `aborted` - aborted
         *     * `finished` - finished
         * @enum {string}
         */
        JobOutStatusEnum: "draft" | "running" | "paused" | "aborted" | "finished";
        /** @description Refuses fields it does not know, so a client cannot believe it set seq, namespace or status. */
        JobStartInRequest: {
            /** @description the dry run's `selection_hash`: the list you saw is the list run */
            selection_hash: string;
            /** @default  */
            reason: string;
        };
        /**
         * @description * `changed` - changed
         *     * `only_in_a` - only_in_a
         *     * `only_in_b` - only_in_b
         * @enum {string}
         */
        KindEnum: "changed" | "only_in_a" | "only_in_b";
        LeaseClaimInRequest: {
            kinds?: string[];
            lease_seconds?: number;
            /** Format: uuid */
            task_id?: string;
        };
        LeaseClaimOut: {
            task: components["schemas"]["TaskOut"];
            lease_epoch: number;
            /** @description RFC 3339, UTC */
            expires_at: string;
            recovered: boolean;
        };
        LeaseEpochInRequest: {
            lease_epoch: number;
        };
        LeaseOut: {
            agent: string;
            epoch: number;
            /** @description RFC 3339, UTC */
            expires_at: string | null;
        };
        /** @description Refuses fields it does not know, so a client cannot believe it set seq, namespace or status. */
        LookupInRequest: {
            /** @description the exact value a client marked with `lookup: true` */
            value: unknown;
            /** @description the namespace whose personal data it is: an agent's own (may be left out), a staff user's scope (may be left out), or any for staff of every namespace (required) */
            namespace?: string;
        };
        LookupOut: {
            subjects: string[];
        };
        /**
         * @description * `deny` - deny
         *     * `escalate` - escalate
         * @enum {string}
         */
        OnExpiryEnum: "deny" | "escalate";
        /** @description Refuses fields it does not know, so a client cannot believe it set seq, namespace or status. */
        OpenInRequest: {
            /** @description any JSON holding envelopes as the API gave them: an event's payload, a task's input, a whole answer */
            value: unknown;
            /** @description the namespace whose personal data it is: an agent's own (may be left out), a staff user's scope (may be left out), or any for staff of every namespace (required) */
            namespace?: string;
            /**
             * Format: uuid
             * @description the task the values were read from, for the record of the read
             */
            task_id?: string;
        };
        OpenOut: {
            /** @description `value` with each envelope replaced by the value sealed in it, or by `{"$personal": {"subject", "erased_at"}}` when its subject was erased */
            value: unknown;
            subjects: components["schemas"]["SubjectStateOut"][];
        };
        /**
         * @description One message to publish with the event. Its headers are the server's (task, seq, event hash,
         *     agent, namespace): a client sets none.
         */
        OutboxItemInRequest: {
            /** @description Routing key on the broker, matched by subscriptions' patterns. Topics beginning with `backplane.` (in any case) belong to the server: 400 validation_error. */
            topic: string;
            payload: Record<string, unknown>;
            /** @description Delivery order is kept per key within the writing agent's namespace (default: the task id). */
            key?: string;
        };
        /** @description Refuses fields it does not know, so a client cannot believe it set seq, namespace or status. */
        PauseInRequest: {
            namespace: string;
            /** @description leave out to pause every kind of the namespace */
            kind?: string;
            reason: string;
        };
        PauseListOut: {
            in_force: components["schemas"]["PauseOut"][];
            /** @description the last 20 lifted, newest first */
            recently_lifted: components["schemas"]["PauseOut"][];
        };
        PauseOut: {
            id: number;
            namespace: string;
            /** @description null: the whole namespace */
            kind: string | null;
            reason: string;
            paused_by: string;
            paused_at: string;
            in_force: boolean;
            resumed_by: string | null;
            resumed_at: string | null;
            resume_reason: string | null;
        };
        /** @description Refuses fields it does not know, so a client cannot believe it set seq, namespace or status. */
        PauseResumeInRequest: {
            reason: string;
        };
        /**
         * @description * `day` - day
         *     * `task` - task
         * @enum {string}
         */
        PeriodEnum: "day" | "task";
        /** @description Refuses fields it does not know, so a client cannot believe it set seq, namespace or status. */
        RequeueInRequest: {
            reason: string;
            payload?: {
                [key: string]: unknown;
            };
        };
        /** @description Refuses fields it does not know, so a client cannot believe it set seq, namespace or status. */
        ResumeInRequest: {
            reason: string;
        };
        /**
         * @description * `namespace` - namespace
         *     * `agent` - agent
         *     * `task` - task
         * @enum {string}
         */
        ScopeEnum: "namespace" | "agent" | "task";
        SignalOut: {
            /** Format: uuid */
            task_id: string;
            name: string;
            status: components["schemas"]["SignalStatusEnum"];
            payload: Record<string, unknown> | null;
            awaited_by: string;
            /** @description RFC 3339, UTC */
            awaited_at: string | null;
            /** @description RFC 3339, UTC */
            expires_at: string | null;
            sent_by: string;
            /** @description RFC 3339, UTC */
            received_at: string | null;
            /** @description RFC 3339, UTC */
            timed_out_at: string | null;
        };
        SignalSendInRequest: {
            payload: Record<string, unknown>;
        };
        /** @enum {string} */
        SignalStatusEnum: "received" | "timed_out" | "waiting";
        SignalWaitInRequest: {
            /** @description how long to wait, 1 s to 30 days */
            timeout_seconds: number;
            lease_epoch?: number;
        };
        SignalWaitOut: {
            /** Format: uuid */
            task_id: string;
            name: string;
            status: components["schemas"]["SignalStatusEnum"];
            payload: Record<string, unknown> | null;
            awaited_by: string;
            /** @description RFC 3339, UTC */
            awaited_at: string | null;
            /** @description RFC 3339, UTC */
            expires_at: string | null;
            sent_by: string;
            /** @description RFC 3339, UTC */
            received_at: string | null;
            /** @description RFC 3339, UTC */
            timed_out_at: string | null;
            /** @description sends this one signal with no credentials: POST it `{"payload": {…}}` */
            callback_url: string;
        };
        SignedTreeHeadOut: {
            tree_size: number;
            root_hash: string;
            signed_at: string;
            signature: string;
            public_key: string;
        };
        SubjectStateOut: {
            subject: string;
            erased_at: string | null;
        };
        SubtaskInRequest: {
            step: number;
            kind: string;
            input: Record<string, unknown>;
            lease_epoch?: number;
        };
        SubtaskOut: {
            task: components["schemas"]["TaskOut"];
            dispatch_key: string;
        };
        /** @description Refuses fields it does not know, so a client cannot believe it set seq, namespace or status. */
        TaskCancelInRequest: {
            reason: string;
            /** @description also undo the task's side effects (its saga) */
            compensate?: boolean;
        };
        TaskCreateInRequest: {
            kind: string;
            input: Record<string, unknown>;
            /** Format: uuid */
            task_id?: string;
            /** Format: uuid */
            parent_task_id?: string | null;
            max_attempts?: number;
            metadata?: Record<string, unknown>;
        };
        TaskDiffOut: {
            /** Format: uuid */
            a: string;
            /** Format: uuid */
            b: string;
            first_divergence: components["schemas"]["DivergenceOut"] | null;
            counts: components["schemas"]["DiffCountsOut"];
        };
        TaskForkInRequest: {
            at_seq: number;
            reason: string;
            input?: Record<string, unknown>;
            /** Format: uuid */
            task_id?: string;
            sandbox?: boolean;
            tool_answers?: components["schemas"]["ToolAnswerInRequest"][];
        };
        TaskListOut: {
            results: components["schemas"]["TaskOut"][];
            /** Format: uri */
            next: string | null;
        };
        /**
         * @description The Task object of docs/api.md, with where a fork continues from (``forked_from``, null
         *     for a task that is no fork) and whether it is a sandbox.
         */
        TaskOut: {
            /** Format: uuid */
            task_id: string;
            namespace: string;
            kind: string;
            status: components["schemas"]["TaskOutStatusEnum"];
            input: Record<string, unknown>;
            output: Record<string, unknown> | null;
            error: string | null;
            /** Format: uuid */
            parent_task_id: string | null;
            attempts: number;
            max_attempts: number;
            lease: components["schemas"]["LeaseOut"] | null;
            last_seq: number;
            head_hash: string;
            /** @description RFC 3339, UTC */
            created_at: string;
            /** @description RFC 3339, UTC */
            updated_at: string;
            /** @description RFC 3339, UTC */
            last_event_at: string | null;
            forked_from: components["schemas"]["ForkedFromOut"] | null;
            sandbox: boolean;
        };
        /** @enum {string} */
        TaskOutStatusEnum: "cancelled" | "compensated" | "compensating" | "completed" | "dead_lettered" | "failed" | "pending" | "running";
        ToolAnswerInRequest: {
            step: number;
            tool: string;
            status: components["schemas"]["AnswerStatusEnum"];
            result: Record<string, unknown>;
        };
        ToolCallDispatchInRequest: {
            step: number;
            tool: string;
            input: Record<string, unknown>;
            lease_epoch?: number;
            compensation?: components["schemas"]["CompensationInRequest"] | null;
            /** @description why the agent makes this call; shown to the people whose approval a tool policy asks for */
            reason?: string;
        };
        ToolCallDispatchOut: {
            idempotency_key: string;
            effect_key: string;
            status: components["schemas"]["ToolCallDispatchOutStatusEnum"];
            /** @description RFC 3339, UTC */
            dispatched_at?: string;
            result?: Record<string, unknown> | null;
            replayed: boolean;
        };
        /** @enum {string} */
        ToolCallDispatchOutStatusEnum: "dispatched" | "failed" | "in_flight" | "succeeded";
        ToolCallOut: {
            idempotency_key: string;
            effect_key: string;
            /** Format: uuid */
            task_id: string;
            step: number;
            tool: string;
            input: Record<string, unknown>;
            compensation: Record<string, unknown> | null;
            status: components["schemas"]["ToolCallOutStatusEnum"];
            result: Record<string, unknown> | null;
            /** @description RFC 3339, UTC */
            dispatched_at: string;
            /** @description RFC 3339, UTC */
            completed_at: string | null;
            /** @description RFC 3339, UTC */
            expires_at: string;
            replayed?: boolean;
        };
        /** @enum {string} */
        ToolCallOutStatusEnum: "failed" | "in_flight" | "succeeded";
        ToolCallResultInRequest: {
            status: components["schemas"]["AnswerStatusEnum"];
            result: Record<string, unknown>;
            lease_epoch?: number;
            /** @description what a paid tool charged: {"amount": "0.02", "currency": "USD"} */
            cost?: Record<string, unknown>;
        };
        ToolInvokeInRequest: {
            /** Format: uuid */
            task_id: string;
            step: number;
            input: Record<string, unknown>;
            lease_epoch?: number;
            /** @description why the agent makes this call; shown to the people whose approval a tool policy asks for */
            reason?: string;
        };
        ToolInvokeOut: {
            idempotency_key: string;
            status: components["schemas"]["AnswerStatusEnum"];
            result: Record<string, unknown>;
            replayed: boolean;
        };
        /** @description Refuses fields it does not know, so a client cannot believe it set seq, namespace or status. */
        ToolPolicyInRequest: {
            /** @description the tool name agents dispatch calls of */
            tool: string;
            /** @description absent or empty: every namespace without a policy of its own */
            namespace?: string;
            /**
             * @description false: from this version on, the tool's calls need no approval
             * @default true
             */
            enabled: boolean;
            /** @description absent or empty: every call; else e.g. `amount > 1000 and currency == "EUR"` */
            condition?: string;
            /** @description the type of each input field the condition names; a dotted name is a path into nested objects */
            field_types?: {
                [key: string]: "number" | "integer" | "string" | "boolean";
            };
            /** @default 1 */
            approvals_required: number;
            /** @description the name of an existing group */
            approver_group: string;
            /** @default 3600 */
            open_seconds: number;
            /** @default deny */
            on_expiry: components["schemas"]["OnExpiryEnum"];
            /** @description with `on_expiry` escalate: the group asked once the first wait runs out */
            escalate_to?: string;
            /** @default true */
            four_eyes: boolean;
            reason: string;
        };
        ToolPolicyListOut: {
            results: components["schemas"]["ToolPolicyOut"][];
        };
        ToolPolicyOut: {
            id: number;
            tool: string;
            /** @description null: every namespace without its own */
            namespace: string | null;
            version: number;
            current: boolean;
            enabled: boolean;
            /** @description null: every call */
            condition: string | null;
            field_types: {
                [key: string]: "number" | "integer" | "string" | "boolean";
            };
            approvals_required: number;
            approver_group: string;
            open_seconds: number;
            on_expiry: components["schemas"]["OnExpiryEnum"];
            escalate_to: string | null;
            four_eyes: boolean;
            set_by: string;
            reason: string;
            created_at: string;
        };
        /**
         * @description * `currency` - currency
         *     * `tokens` - tokens
         * @enum {string}
         */
        UnitEnum: "currency" | "tokens";
    };
    responses: never;
    parameters: never;
    requestBodies: never;
    headers: never;
    pathItems: never;
}
export type $defs = Record<string, never>;
export interface operations {
    approvals_list: {
        parameters: {
            query?: {
                /** @description default `pending` */
                status?: "all" | "denied" | "expired" | "granted" | "pending";
            };
            header?: never;
            path?: never;
            cookie?: never;
        };
        requestBody?: never;
        responses: {
            200: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ApprovalListOut"];
                };
            };
            /** @description validation_error: malformed JSON (nested deeper than 64 levels, duplicate keys, NUL, lone surrogates, numbers outside a double), wrong types, unknown fields, a reserved event type. `details` maps fields (`events[0].payload`, `body` for the JSON itself) to messages. */
            400: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description not_authenticated: no token, or a token that is unknown or inactive. */
            401: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description permission_denied: authenticated but not allowed (an agent reviewing dead letters, a staff session creating tasks). */
            403: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description payload_too_large: the body is over the limit (default 256 KiB), declared or sent chunked. */
            413: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description rate_limited: over the per-token rate limit; wait `Retry-After` seconds. */
            429: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description circuit_open (the agent's or tool's breaker is open) or unavailable (the database is down); `Retry-After` says when to retry. */
            503: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
        };
    };
    approvals_read: {
        parameters: {
            query?: {
                /** @description seconds to wait for a decision, 0 to 30; default 0 */
                wait?: number;
            };
            header?: never;
            path: {
                /** @description the request's id */
                approval_id: string;
            };
            cookie?: never;
        };
        requestBody?: never;
        responses: {
            200: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ApprovalOut"];
                };
            };
            /** @description validation_error: malformed JSON (nested deeper than 64 levels, duplicate keys, NUL, lone surrogates, numbers outside a double), wrong types, unknown fields, a reserved event type. `details` maps fields (`events[0].payload`, `body` for the JSON itself) to messages. */
            400: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description not_authenticated: no token, or a token that is unknown or inactive. */
            401: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description not_found: no such object in the caller's namespace (another namespace's task is 404 too), or no such route. */
            404: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description payload_too_large: the body is over the limit (default 256 KiB), declared or sent chunked. */
            413: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description rate_limited: over the per-token rate limit; wait `Retry-After` seconds. */
            429: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description circuit_open (the agent's or tool's breaker is open) or unavailable (the database is down); `Retry-After` says when to retry. */
            503: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
        };
    };
    approvals_approve: {
        parameters: {
            query?: never;
            header?: never;
            path: {
                /** @description the request's id */
                approval_id: string;
            };
            cookie?: never;
        };
        requestBody: {
            content: {
                "application/json": components["schemas"]["DecisionInRequest"];
            };
        };
        responses: {
            200: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ApprovalOut"];
                };
            };
            /** @description validation_error: malformed JSON (nested deeper than 64 levels, duplicate keys, NUL, lone surrogates, numbers outside a double), wrong types, unknown fields, a reserved event type. `details` maps fields (`events[0].payload`, `body` for the JSON itself) to messages. */
            400: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description not_authenticated: no token, or a token that is unknown or inactive. */
            401: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description permission_denied: authenticated but not allowed (an agent reviewing dead letters, a staff session creating tasks). */
            403: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description not_found: no such object in the caller's namespace (another namespace's task is 404 too), or no such route. */
            404: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description Conflict: `already_decided`. */
            409: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description payload_too_large: the body is over the limit (default 256 KiB), declared or sent chunked. */
            413: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description unsupported_media_type: the body is not `application/json`. */
            415: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description rate_limited: over the per-token rate limit; wait `Retry-After` seconds. */
            429: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description circuit_open (the agent's or tool's breaker is open) or unavailable (the database is down); `Retry-After` says when to retry. */
            503: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
        };
    };
    approvals_deny: {
        parameters: {
            query?: never;
            header?: never;
            path: {
                /** @description the request's id */
                approval_id: string;
            };
            cookie?: never;
        };
        requestBody: {
            content: {
                "application/json": components["schemas"]["DecisionInRequest"];
            };
        };
        responses: {
            200: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ApprovalOut"];
                };
            };
            /** @description validation_error: malformed JSON (nested deeper than 64 levels, duplicate keys, NUL, lone surrogates, numbers outside a double), wrong types, unknown fields, a reserved event type. `details` maps fields (`events[0].payload`, `body` for the JSON itself) to messages. */
            400: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description not_authenticated: no token, or a token that is unknown or inactive. */
            401: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description permission_denied: authenticated but not allowed (an agent reviewing dead letters, a staff session creating tasks). */
            403: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description not_found: no such object in the caller's namespace (another namespace's task is 404 too), or no such route. */
            404: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description Conflict: `already_decided`. */
            409: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description payload_too_large: the body is over the limit (default 256 KiB), declared or sent chunked. */
            413: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description unsupported_media_type: the body is not `application/json`. */
            415: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description rate_limited: over the per-token rate limit; wait `Retry-After` seconds. */
            429: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description circuit_open (the agent's or tool's breaker is open) or unavailable (the database is down); `Retry-After` says when to retry. */
            503: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
        };
    };
    budgets_list: {
        parameters: {
            query?: never;
            header?: never;
            path?: never;
            cookie?: never;
        };
        requestBody?: never;
        responses: {
            200: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["BudgetListOut"];
                };
            };
            /** @description validation_error: malformed JSON (nested deeper than 64 levels, duplicate keys, NUL, lone surrogates, numbers outside a double), wrong types, unknown fields, a reserved event type. `details` maps fields (`events[0].payload`, `body` for the JSON itself) to messages. */
            400: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description not_authenticated: no token, or a token that is unknown or inactive. */
            401: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description permission_denied: authenticated but not allowed (an agent reviewing dead letters, a staff session creating tasks). */
            403: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description payload_too_large: the body is over the limit (default 256 KiB), declared or sent chunked. */
            413: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description rate_limited: over the per-token rate limit; wait `Retry-After` seconds. */
            429: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description circuit_open (the agent's or tool's breaker is open) or unavailable (the database is down); `Retry-After` says when to retry. */
            503: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
        };
    };
    budgets_set: {
        parameters: {
            query?: never;
            header?: never;
            path?: never;
            cookie?: never;
        };
        requestBody: {
            content: {
                "application/json": components["schemas"]["BudgetInRequest"];
            };
        };
        responses: {
            200: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["BudgetOut"];
                };
            };
            /** @description validation_error: malformed JSON (nested deeper than 64 levels, duplicate keys, NUL, lone surrogates, numbers outside a double), wrong types, unknown fields, a reserved event type. `details` maps fields (`events[0].payload`, `body` for the JSON itself) to messages. */
            400: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description not_authenticated: no token, or a token that is unknown or inactive. */
            401: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description permission_denied: authenticated but not allowed (an agent reviewing dead letters, a staff session creating tasks). */
            403: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description payload_too_large: the body is over the limit (default 256 KiB), declared or sent chunked. */
            413: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description unsupported_media_type: the body is not `application/json`. */
            415: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description rate_limited: over the per-token rate limit; wait `Retry-After` seconds. */
            429: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description circuit_open (the agent's or tool's breaker is open) or unavailable (the database is down); `Retry-After` says when to retry. */
            503: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
        };
    };
    budgets_ask_approve: {
        parameters: {
            query?: never;
            header?: never;
            path: {
                /** @description the budget's id */
                budget_id: number;
            };
            cookie?: never;
        };
        requestBody: {
            content: {
                "application/json": components["schemas"]["ResumeInRequest"];
            };
        };
        responses: {
            200: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["BudgetOut"];
                };
            };
            /** @description validation_error: malformed JSON (nested deeper than 64 levels, duplicate keys, NUL, lone surrogates, numbers outside a double), wrong types, unknown fields, a reserved event type. `details` maps fields (`events[0].payload`, `body` for the JSON itself) to messages. */
            400: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description not_authenticated: no token, or a token that is unknown or inactive. */
            401: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description permission_denied: authenticated but not allowed (an agent reviewing dead letters, a staff session creating tasks). */
            403: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description not_found: no such object in the caller's namespace (another namespace's task is 404 too), or no such route. */
            404: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description Conflict: `already_decided`. */
            409: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description payload_too_large: the body is over the limit (default 256 KiB), declared or sent chunked. */
            413: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description unsupported_media_type: the body is not `application/json`. */
            415: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description rate_limited: over the per-token rate limit; wait `Retry-After` seconds. */
            429: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description circuit_open (the agent's or tool's breaker is open) or unavailable (the database is down); `Retry-After` says when to retry. */
            503: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
        };
    };
    budgets_ask_deny: {
        parameters: {
            query?: never;
            header?: never;
            path: {
                /** @description the budget's id */
                budget_id: number;
            };
            cookie?: never;
        };
        requestBody: {
            content: {
                "application/json": components["schemas"]["ResumeInRequest"];
            };
        };
        responses: {
            200: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["BudgetOut"];
                };
            };
            /** @description validation_error: malformed JSON (nested deeper than 64 levels, duplicate keys, NUL, lone surrogates, numbers outside a double), wrong types, unknown fields, a reserved event type. `details` maps fields (`events[0].payload`, `body` for the JSON itself) to messages. */
            400: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description not_authenticated: no token, or a token that is unknown or inactive. */
            401: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description permission_denied: authenticated but not allowed (an agent reviewing dead letters, a staff session creating tasks). */
            403: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description not_found: no such object in the caller's namespace (another namespace's task is 404 too), or no such route. */
            404: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description Conflict: `already_decided`. */
            409: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description payload_too_large: the body is over the limit (default 256 KiB), declared or sent chunked. */
            413: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description unsupported_media_type: the body is not `application/json`. */
            415: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description rate_limited: over the per-token rate limit; wait `Retry-After` seconds. */
            429: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description circuit_open (the agent's or tool's breaker is open) or unavailable (the database is down); `Retry-After` says when to retry. */
            503: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
        };
    };
    budgets_resume: {
        parameters: {
            query?: never;
            header?: never;
            path: {
                /** @description the budget's id */
                budget_id: number;
            };
            cookie?: never;
        };
        requestBody: {
            content: {
                "application/json": components["schemas"]["ResumeInRequest"];
            };
        };
        responses: {
            200: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["BudgetOut"];
                };
            };
            /** @description validation_error: malformed JSON (nested deeper than 64 levels, duplicate keys, NUL, lone surrogates, numbers outside a double), wrong types, unknown fields, a reserved event type. `details` maps fields (`events[0].payload`, `body` for the JSON itself) to messages. */
            400: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description not_authenticated: no token, or a token that is unknown or inactive. */
            401: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description permission_denied: authenticated but not allowed (an agent reviewing dead letters, a staff session creating tasks). */
            403: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description not_found: no such object in the caller's namespace (another namespace's task is 404 too), or no such route. */
            404: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description payload_too_large: the body is over the limit (default 256 KiB), declared or sent chunked. */
            413: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description unsupported_media_type: the body is not `application/json`. */
            415: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description rate_limited: over the per-token rate limit; wait `Retry-After` seconds. */
            429: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description circuit_open (the agent's or tool's breaker is open) or unavailable (the database is down); `Retry-After` says when to retry. */
            503: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
        };
    };
    dead_letters_list: {
        parameters: {
            query?: {
                /** @description the `next` link's cursor */
                cursor?: number;
                /** @description 1-1000, default 100 */
                limit?: number;
                /** @description only items in this status */
                status?: "discarded" | "pending" | "requeued";
            };
            header?: never;
            path?: never;
            cookie?: never;
        };
        requestBody?: never;
        responses: {
            200: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["DeadLetterListOut"];
                };
            };
            /** @description validation_error: malformed JSON (nested deeper than 64 levels, duplicate keys, NUL, lone surrogates, numbers outside a double), wrong types, unknown fields, a reserved event type. `details` maps fields (`events[0].payload`, `body` for the JSON itself) to messages. */
            400: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description not_authenticated: no token, or a token that is unknown or inactive. */
            401: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description permission_denied: authenticated but not allowed (an agent reviewing dead letters, a staff session creating tasks). */
            403: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description payload_too_large: the body is over the limit (default 256 KiB), declared or sent chunked. */
            413: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description rate_limited: over the per-token rate limit; wait `Retry-After` seconds. */
            429: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description circuit_open (the agent's or tool's breaker is open) or unavailable (the database is down); `Retry-After` says when to retry. */
            503: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
        };
    };
    dead_letters_discard: {
        parameters: {
            query?: never;
            header?: never;
            path: {
                /** @description the dead letter's id */
                dead_letter_id: number;
            };
            cookie?: never;
        };
        requestBody: {
            content: {
                "application/json": components["schemas"]["DiscardInRequest"];
            };
        };
        responses: {
            200: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["DeadLetterOut"];
                };
            };
            /** @description validation_error: malformed JSON (nested deeper than 64 levels, duplicate keys, NUL, lone surrogates, numbers outside a double), wrong types, unknown fields, a reserved event type. `details` maps fields (`events[0].payload`, `body` for the JSON itself) to messages. */
            400: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description not_authenticated: no token, or a token that is unknown or inactive. */
            401: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description permission_denied: authenticated but not allowed (an agent reviewing dead letters, a staff session creating tasks). */
            403: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description not_found: no such object in the caller's namespace (another namespace's task is 404 too), or no such route. */
            404: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description Conflict: `already_decided`. */
            409: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description payload_too_large: the body is over the limit (default 256 KiB), declared or sent chunked. */
            413: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description unsupported_media_type: the body is not `application/json`. */
            415: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description rate_limited: over the per-token rate limit; wait `Retry-After` seconds. */
            429: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description circuit_open (the agent's or tool's breaker is open) or unavailable (the database is down); `Retry-After` says when to retry. */
            503: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
        };
    };
    dead_letters_requeue: {
        parameters: {
            query?: never;
            header?: never;
            path: {
                /** @description the dead letter's id */
                dead_letter_id: number;
            };
            cookie?: never;
        };
        requestBody: {
            content: {
                "application/json": components["schemas"]["RequeueInRequest"];
            };
        };
        responses: {
            200: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["DeadLetterOut"];
                };
            };
            /** @description validation_error: malformed JSON (nested deeper than 64 levels, duplicate keys, NUL, lone surrogates, numbers outside a double), wrong types, unknown fields, a reserved event type. `details` maps fields (`events[0].payload`, `body` for the JSON itself) to messages. */
            400: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description not_authenticated: no token, or a token that is unknown or inactive. */
            401: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description permission_denied: authenticated but not allowed (an agent reviewing dead letters, a staff session creating tasks). */
            403: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description not_found: no such object in the caller's namespace (another namespace's task is 404 too), or no such route. */
            404: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description Conflict: `already_decided`. */
            409: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description payload_too_large: the body is over the limit (default 256 KiB), declared or sent chunked. */
            413: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description unsupported_media_type: the body is not `application/json`. */
            415: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description rate_limited: over the per-token rate limit; wait `Retry-After` seconds. */
            429: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description circuit_open (the agent's or tool's breaker is open) or unavailable (the database is down); `Retry-After` says when to retry. */
            503: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
        };
    };
    events_inclusion_proof: {
        parameters: {
            query?: {
                /** @description a signed tree size; default the latest */
                tree_size?: number;
            };
            header?: never;
            path: {
                /** @description the event's `position` */
                position: number;
            };
            cookie?: never;
        };
        requestBody?: never;
        responses: {
            200: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["InclusionProofOut"];
                };
            };
            /** @description validation_error: malformed JSON (nested deeper than 64 levels, duplicate keys, NUL, lone surrogates, numbers outside a double), wrong types, unknown fields, a reserved event type. `details` maps fields (`events[0].payload`, `body` for the JSON itself) to messages. */
            400: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description not_authenticated: no token, or a token that is unknown or inactive. */
            401: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description not_found: no such object in the caller's namespace (another namespace's task is 404 too), or no such route. */
            404: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description payload_too_large: the body is over the limit (default 256 KiB), declared or sent chunked. */
            413: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description rate_limited: over the per-token rate limit; wait `Retry-After` seconds. */
            429: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description circuit_open (the agent's or tool's breaker is open) or unavailable (the database is down); `Retry-After` says when to retry. */
            503: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
        };
    };
    jobs_list: {
        parameters: {
            query?: {
                /** @description the `next` link's cursor */
                cursor?: number;
                /** @description 1-200, default 50 */
                limit?: number;
            };
            header?: never;
            path?: never;
            cookie?: never;
        };
        requestBody?: never;
        responses: {
            200: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["JobListOut"];
                };
            };
            /** @description validation_error: malformed JSON (nested deeper than 64 levels, duplicate keys, NUL, lone surrogates, numbers outside a double), wrong types, unknown fields, a reserved event type. `details` maps fields (`events[0].payload`, `body` for the JSON itself) to messages. */
            400: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description not_authenticated: no token, or a token that is unknown or inactive. */
            401: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description permission_denied: authenticated but not allowed (an agent reviewing dead letters, a staff session creating tasks). */
            403: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description payload_too_large: the body is over the limit (default 256 KiB), declared or sent chunked. */
            413: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description rate_limited: over the per-token rate limit; wait `Retry-After` seconds. */
            429: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description circuit_open (the agent's or tool's breaker is open) or unavailable (the database is down); `Retry-After` says when to retry. */
            503: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
        };
    };
    jobs_create: {
        parameters: {
            query?: never;
            header?: never;
            path?: never;
            cookie?: never;
        };
        requestBody: {
            content: {
                "application/json": components["schemas"]["JobCreateInRequest"];
            };
        };
        responses: {
            201: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["JobOut"];
                };
            };
            /** @description validation_error: malformed JSON (nested deeper than 64 levels, duplicate keys, NUL, lone surrogates, numbers outside a double), wrong types, unknown fields, a reserved event type. `details` maps fields (`events[0].payload`, `body` for the JSON itself) to messages. */
            400: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description not_authenticated: no token, or a token that is unknown or inactive. */
            401: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description permission_denied: authenticated but not allowed (an agent reviewing dead letters, a staff session creating tasks). */
            403: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description payload_too_large: the body is over the limit (default 256 KiB), declared or sent chunked. */
            413: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description unsupported_media_type: the body is not `application/json`. */
            415: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description rate_limited: over the per-token rate limit; wait `Retry-After` seconds. */
            429: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description circuit_open (the agent's or tool's breaker is open) or unavailable (the database is down); `Retry-After` says when to retry. */
            503: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
        };
    };
    jobs_get: {
        parameters: {
            query?: never;
            header?: never;
            path: {
                /** @description the job's id */
                job_id: number;
            };
            cookie?: never;
        };
        requestBody?: never;
        responses: {
            200: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["JobOut"];
                };
            };
            /** @description validation_error: malformed JSON (nested deeper than 64 levels, duplicate keys, NUL, lone surrogates, numbers outside a double), wrong types, unknown fields, a reserved event type. `details` maps fields (`events[0].payload`, `body` for the JSON itself) to messages. */
            400: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description not_authenticated: no token, or a token that is unknown or inactive. */
            401: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description permission_denied: authenticated but not allowed (an agent reviewing dead letters, a staff session creating tasks). */
            403: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description not_found: no such object in the caller's namespace (another namespace's task is 404 too), or no such route. */
            404: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description payload_too_large: the body is over the limit (default 256 KiB), declared or sent chunked. */
            413: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description rate_limited: over the per-token rate limit; wait `Retry-After` seconds. */
            429: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description circuit_open (the agent's or tool's breaker is open) or unavailable (the database is down); `Retry-After` says when to retry. */
            503: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
        };
    };
    jobs_abort: {
        parameters: {
            query?: never;
            header?: never;
            path: {
                /** @description the job's id */
                job_id: number;
            };
            cookie?: never;
        };
        requestBody: {
            content: {
                "application/json": components["schemas"]["JobDecisionInRequest"];
            };
        };
        responses: {
            200: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["JobOut"];
                };
            };
            /** @description validation_error: malformed JSON (nested deeper than 64 levels, duplicate keys, NUL, lone surrogates, numbers outside a double), wrong types, unknown fields, a reserved event type. `details` maps fields (`events[0].payload`, `body` for the JSON itself) to messages. */
            400: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description not_authenticated: no token, or a token that is unknown or inactive. */
            401: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description permission_denied: authenticated but not allowed (an agent reviewing dead letters, a staff session creating tasks). */
            403: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description not_found: no such object in the caller's namespace (another namespace's task is 404 too), or no such route. */
            404: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description Conflict: `job_conflict`. */
            409: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description payload_too_large: the body is over the limit (default 256 KiB), declared or sent chunked. */
            413: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description unsupported_media_type: the body is not `application/json`. */
            415: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description rate_limited: over the per-token rate limit; wait `Retry-After` seconds. */
            429: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description circuit_open (the agent's or tool's breaker is open) or unavailable (the database is down); `Retry-After` says when to retry. */
            503: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
        };
    };
    jobs_items: {
        parameters: {
            query?: {
                /** @description the `next` link's cursor */
                cursor?: number;
                /** @description 1-1000, default 100 */
                limit?: number;
                /** @description only items in this status */
                status?: "done" | "failed" | "pending" | "skipped";
            };
            header?: never;
            path: {
                /** @description the job's id */
                job_id: number;
            };
            cookie?: never;
        };
        requestBody?: never;
        responses: {
            200: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["JobItemListOut"];
                };
            };
            /** @description validation_error: malformed JSON (nested deeper than 64 levels, duplicate keys, NUL, lone surrogates, numbers outside a double), wrong types, unknown fields, a reserved event type. `details` maps fields (`events[0].payload`, `body` for the JSON itself) to messages. */
            400: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description not_authenticated: no token, or a token that is unknown or inactive. */
            401: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description permission_denied: authenticated but not allowed (an agent reviewing dead letters, a staff session creating tasks). */
            403: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description not_found: no such object in the caller's namespace (another namespace's task is 404 too), or no such route. */
            404: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description payload_too_large: the body is over the limit (default 256 KiB), declared or sent chunked. */
            413: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description rate_limited: over the per-token rate limit; wait `Retry-After` seconds. */
            429: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description circuit_open (the agent's or tool's breaker is open) or unavailable (the database is down); `Retry-After` says when to retry. */
            503: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
        };
    };
    jobs_pause: {
        parameters: {
            query?: never;
            header?: never;
            path: {
                /** @description the job's id */
                job_id: number;
            };
            cookie?: never;
        };
        requestBody: {
            content: {
                "application/json": components["schemas"]["JobDecisionInRequest"];
            };
        };
        responses: {
            200: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["JobOut"];
                };
            };
            /** @description validation_error: malformed JSON (nested deeper than 64 levels, duplicate keys, NUL, lone surrogates, numbers outside a double), wrong types, unknown fields, a reserved event type. `details` maps fields (`events[0].payload`, `body` for the JSON itself) to messages. */
            400: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description not_authenticated: no token, or a token that is unknown or inactive. */
            401: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description permission_denied: authenticated but not allowed (an agent reviewing dead letters, a staff session creating tasks). */
            403: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description not_found: no such object in the caller's namespace (another namespace's task is 404 too), or no such route. */
            404: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description Conflict: `job_conflict`. */
            409: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description payload_too_large: the body is over the limit (default 256 KiB), declared or sent chunked. */
            413: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description unsupported_media_type: the body is not `application/json`. */
            415: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description rate_limited: over the per-token rate limit; wait `Retry-After` seconds. */
            429: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description circuit_open (the agent's or tool's breaker is open) or unavailable (the database is down); `Retry-After` says when to retry. */
            503: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
        };
    };
    jobs_resume: {
        parameters: {
            query?: never;
            header?: never;
            path: {
                /** @description the job's id */
                job_id: number;
            };
            cookie?: never;
        };
        requestBody: {
            content: {
                "application/json": components["schemas"]["JobDecisionInRequest"];
            };
        };
        responses: {
            200: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["JobOut"];
                };
            };
            /** @description validation_error: malformed JSON (nested deeper than 64 levels, duplicate keys, NUL, lone surrogates, numbers outside a double), wrong types, unknown fields, a reserved event type. `details` maps fields (`events[0].payload`, `body` for the JSON itself) to messages. */
            400: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description not_authenticated: no token, or a token that is unknown or inactive. */
            401: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description permission_denied: authenticated but not allowed (an agent reviewing dead letters, a staff session creating tasks). */
            403: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description not_found: no such object in the caller's namespace (another namespace's task is 404 too), or no such route. */
            404: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description Conflict: `job_conflict`. */
            409: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description payload_too_large: the body is over the limit (default 256 KiB), declared or sent chunked. */
            413: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description unsupported_media_type: the body is not `application/json`. */
            415: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description rate_limited: over the per-token rate limit; wait `Retry-After` seconds. */
            429: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description circuit_open (the agent's or tool's breaker is open) or unavailable (the database is down); `Retry-After` says when to retry. */
            503: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
        };
    };
    jobs_retry_failed: {
        parameters: {
            query?: never;
            header?: never;
            path: {
                /** @description the job's id */
                job_id: number;
            };
            cookie?: never;
        };
        requestBody: {
            content: {
                "application/json": components["schemas"]["JobDecisionInRequest"];
            };
        };
        responses: {
            201: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["JobOut"];
                };
            };
            /** @description validation_error: malformed JSON (nested deeper than 64 levels, duplicate keys, NUL, lone surrogates, numbers outside a double), wrong types, unknown fields, a reserved event type. `details` maps fields (`events[0].payload`, `body` for the JSON itself) to messages. */
            400: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description not_authenticated: no token, or a token that is unknown or inactive. */
            401: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description permission_denied: authenticated but not allowed (an agent reviewing dead letters, a staff session creating tasks). */
            403: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description not_found: no such object in the caller's namespace (another namespace's task is 404 too), or no such route. */
            404: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description Conflict: `job_conflict`. */
            409: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description payload_too_large: the body is over the limit (default 256 KiB), declared or sent chunked. */
            413: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description unsupported_media_type: the body is not `application/json`. */
            415: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description rate_limited: over the per-token rate limit; wait `Retry-After` seconds. */
            429: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description circuit_open (the agent's or tool's breaker is open) or unavailable (the database is down); `Retry-After` says when to retry. */
            503: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
        };
    };
    jobs_start: {
        parameters: {
            query?: never;
            header?: never;
            path: {
                /** @description the job's id */
                job_id: number;
            };
            cookie?: never;
        };
        requestBody: {
            content: {
                "application/json": components["schemas"]["JobStartInRequest"];
            };
        };
        responses: {
            200: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["JobOut"];
                };
            };
            /** @description validation_error: malformed JSON (nested deeper than 64 levels, duplicate keys, NUL, lone surrogates, numbers outside a double), wrong types, unknown fields, a reserved event type. `details` maps fields (`events[0].payload`, `body` for the JSON itself) to messages. */
            400: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description not_authenticated: no token, or a token that is unknown or inactive. */
            401: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description permission_denied: authenticated but not allowed (an agent reviewing dead letters, a staff session creating tasks). */
            403: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description not_found: no such object in the caller's namespace (another namespace's task is 404 too), or no such route. */
            404: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description Conflict: `job_conflict`. */
            409: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description payload_too_large: the body is over the limit (default 256 KiB), declared or sent chunked. */
            413: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description unsupported_media_type: the body is not `application/json`. */
            415: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description rate_limited: over the per-token rate limit; wait `Retry-After` seconds. */
            429: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description circuit_open (the agent's or tool's breaker is open) or unavailable (the database is down); `Retry-After` says when to retry. */
            503: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
        };
    };
    leases_claim: {
        parameters: {
            query?: never;
            header?: never;
            path?: never;
            cookie?: never;
        };
        requestBody?: {
            content: {
                "application/json": components["schemas"]["LeaseClaimInRequest"];
            };
        };
        responses: {
            200: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["LeaseClaimOut"];
                };
            };
            /** @description nothing pending */
            204: {
                headers: {
                    [name: string]: unknown;
                };
                content?: never;
            };
            /** @description validation_error: malformed JSON (nested deeper than 64 levels, duplicate keys, NUL, lone surrogates, numbers outside a double), wrong types, unknown fields, a reserved event type. `details` maps fields (`events[0].payload`, `body` for the JSON itself) to messages. */
            400: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description not_authenticated: no token, or a token that is unknown or inactive. */
            401: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description permission_denied: authenticated but not allowed (an agent reviewing dead letters, a staff session creating tasks). */
            403: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description Conflict: `budget_exceeded`. */
            409: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description payload_too_large: the body is over the limit (default 256 KiB), declared or sent chunked. */
            413: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description unsupported_media_type: the body is not `application/json`. */
            415: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description rate_limited: over the per-token rate limit; wait `Retry-After` seconds. */
            429: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description circuit_open (the agent's or tool's breaker is open) or unavailable (the database is down); `Retry-After` says when to retry. */
            503: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
        };
    };
    pauses_list: {
        parameters: {
            query?: never;
            header?: never;
            path?: never;
            cookie?: never;
        };
        requestBody?: never;
        responses: {
            200: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["PauseListOut"];
                };
            };
            /** @description validation_error: malformed JSON (nested deeper than 64 levels, duplicate keys, NUL, lone surrogates, numbers outside a double), wrong types, unknown fields, a reserved event type. `details` maps fields (`events[0].payload`, `body` for the JSON itself) to messages. */
            400: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description not_authenticated: no token, or a token that is unknown or inactive. */
            401: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description permission_denied: authenticated but not allowed (an agent reviewing dead letters, a staff session creating tasks). */
            403: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description payload_too_large: the body is over the limit (default 256 KiB), declared or sent chunked. */
            413: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description rate_limited: over the per-token rate limit; wait `Retry-After` seconds. */
            429: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description circuit_open (the agent's or tool's breaker is open) or unavailable (the database is down); `Retry-After` says when to retry. */
            503: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
        };
    };
    pauses_set: {
        parameters: {
            query?: never;
            header?: never;
            path?: never;
            cookie?: never;
        };
        requestBody: {
            content: {
                "application/json": components["schemas"]["PauseInRequest"];
            };
        };
        responses: {
            201: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["PauseOut"];
                };
            };
            /** @description validation_error: malformed JSON (nested deeper than 64 levels, duplicate keys, NUL, lone surrogates, numbers outside a double), wrong types, unknown fields, a reserved event type. `details` maps fields (`events[0].payload`, `body` for the JSON itself) to messages. */
            400: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description not_authenticated: no token, or a token that is unknown or inactive. */
            401: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description permission_denied: authenticated but not allowed (an agent reviewing dead letters, a staff session creating tasks). */
            403: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description Conflict: `pause_in_force`. */
            409: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description payload_too_large: the body is over the limit (default 256 KiB), declared or sent chunked. */
            413: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description unsupported_media_type: the body is not `application/json`. */
            415: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description rate_limited: over the per-token rate limit; wait `Retry-After` seconds. */
            429: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description circuit_open (the agent's or tool's breaker is open) or unavailable (the database is down); `Retry-After` says when to retry. */
            503: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
        };
    };
    pauses_resume: {
        parameters: {
            query?: never;
            header?: never;
            path: {
                /** @description the pause's id */
                pause_id: number;
            };
            cookie?: never;
        };
        requestBody: {
            content: {
                "application/json": components["schemas"]["PauseResumeInRequest"];
            };
        };
        responses: {
            200: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["PauseOut"];
                };
            };
            /** @description validation_error: malformed JSON (nested deeper than 64 levels, duplicate keys, NUL, lone surrogates, numbers outside a double), wrong types, unknown fields, a reserved event type. `details` maps fields (`events[0].payload`, `body` for the JSON itself) to messages. */
            400: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description not_authenticated: no token, or a token that is unknown or inactive. */
            401: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description permission_denied: authenticated but not allowed (an agent reviewing dead letters, a staff session creating tasks). */
            403: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description not_found: no such object in the caller's namespace (another namespace's task is 404 too), or no such route. */
            404: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description Conflict: `already_decided`. */
            409: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description payload_too_large: the body is over the limit (default 256 KiB), declared or sent chunked. */
            413: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description unsupported_media_type: the body is not `application/json`. */
            415: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description rate_limited: over the per-token rate limit; wait `Retry-After` seconds. */
            429: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description circuit_open (the agent's or tool's breaker is open) or unavailable (the database is down); `Retry-After` says when to retry. */
            503: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
        };
    };
    personal_data_erase: {
        parameters: {
            query?: never;
            header?: never;
            path?: never;
            cookie?: never;
        };
        requestBody: {
            content: {
                "application/json": components["schemas"]["EraseInRequest"];
            };
        };
        responses: {
            200: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErasedOut"];
                };
            };
            /** @description validation_error: malformed JSON (nested deeper than 64 levels, duplicate keys, NUL, lone surrogates, numbers outside a double), wrong types, unknown fields, a reserved event type. `details` maps fields (`events[0].payload`, `body` for the JSON itself) to messages. */
            400: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description not_authenticated: no token, or a token that is unknown or inactive. */
            401: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description permission_denied: authenticated but not allowed (an agent reviewing dead letters, a staff session creating tasks). */
            403: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description not_found: no such object in the caller's namespace (another namespace's task is 404 too), or no such route. */
            404: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description Conflict: `subject_erased`. */
            409: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description payload_too_large: the body is over the limit (default 256 KiB), declared or sent chunked. */
            413: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description unsupported_media_type: the body is not `application/json`. */
            415: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description rate_limited: over the per-token rate limit; wait `Retry-After` seconds. */
            429: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description circuit_open (the agent's or tool's breaker is open) or unavailable (the database is down); `Retry-After` says when to retry. */
            503: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
        };
    };
    personal_data_lookup: {
        parameters: {
            query?: never;
            header?: never;
            path?: never;
            cookie?: never;
        };
        requestBody: {
            content: {
                "application/json": components["schemas"]["LookupInRequest"];
            };
        };
        responses: {
            200: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["LookupOut"];
                };
            };
            /** @description validation_error: malformed JSON (nested deeper than 64 levels, duplicate keys, NUL, lone surrogates, numbers outside a double), wrong types, unknown fields, a reserved event type. `details` maps fields (`events[0].payload`, `body` for the JSON itself) to messages. */
            400: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description not_authenticated: no token, or a token that is unknown or inactive. */
            401: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description permission_denied: authenticated but not allowed (an agent reviewing dead letters, a staff session creating tasks). */
            403: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description payload_too_large: the body is over the limit (default 256 KiB), declared or sent chunked. */
            413: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description unsupported_media_type: the body is not `application/json`. */
            415: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description rate_limited: over the per-token rate limit; wait `Retry-After` seconds. */
            429: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description circuit_open (the agent's or tool's breaker is open) or unavailable (the database is down); `Retry-After` says when to retry. */
            503: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
        };
    };
    personal_data_open: {
        parameters: {
            query?: never;
            header?: never;
            path?: never;
            cookie?: never;
        };
        requestBody: {
            content: {
                "application/json": components["schemas"]["OpenInRequest"];
            };
        };
        responses: {
            200: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["OpenOut"];
                };
            };
            /** @description validation_error: malformed JSON (nested deeper than 64 levels, duplicate keys, NUL, lone surrogates, numbers outside a double), wrong types, unknown fields, a reserved event type. `details` maps fields (`events[0].payload`, `body` for the JSON itself) to messages. */
            400: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description not_authenticated: no token, or a token that is unknown or inactive. */
            401: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description permission_denied: authenticated but not allowed (an agent reviewing dead letters, a staff session creating tasks). */
            403: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description payload_too_large: the body is over the limit (default 256 KiB), declared or sent chunked. */
            413: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description unsupported_media_type: the body is not `application/json`. */
            415: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description rate_limited: over the per-token rate limit; wait `Retry-After` seconds. */
            429: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description circuit_open (the agent's or tool's breaker is open) or unavailable (the database is down); `Retry-After` says when to retry. */
            503: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
        };
    };
    seals_consistency_proof: {
        parameters: {
            query: {
                /** @description the smaller signed tree size */
                first: number;
                /** @description the larger signed tree size */
                second: number;
            };
            header?: never;
            path?: never;
            cookie?: never;
        };
        requestBody?: never;
        responses: {
            200: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ConsistencyProofOut"];
                };
            };
            /** @description validation_error: malformed JSON (nested deeper than 64 levels, duplicate keys, NUL, lone surrogates, numbers outside a double), wrong types, unknown fields, a reserved event type. `details` maps fields (`events[0].payload`, `body` for the JSON itself) to messages. */
            400: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description not_authenticated: no token, or a token that is unknown or inactive. */
            401: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description not_found: no such object in the caller's namespace (another namespace's task is 404 too), or no such route. */
            404: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description payload_too_large: the body is over the limit (default 256 KiB), declared or sent chunked. */
            413: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description rate_limited: over the per-token rate limit; wait `Retry-After` seconds. */
            429: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description circuit_open (the agent's or tool's breaker is open) or unavailable (the database is down); `Retry-After` says when to retry. */
            503: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
        };
    };
    seals_latest: {
        parameters: {
            query?: never;
            header?: never;
            path?: never;
            cookie?: never;
        };
        requestBody?: never;
        responses: {
            200: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["SignedTreeHeadOut"];
                };
            };
            /** @description validation_error: malformed JSON (nested deeper than 64 levels, duplicate keys, NUL, lone surrogates, numbers outside a double), wrong types, unknown fields, a reserved event type. `details` maps fields (`events[0].payload`, `body` for the JSON itself) to messages. */
            400: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description not_authenticated: no token, or a token that is unknown or inactive. */
            401: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description not_found: no such object in the caller's namespace (another namespace's task is 404 too), or no such route. */
            404: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description payload_too_large: the body is over the limit (default 256 KiB), declared or sent chunked. */
            413: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description rate_limited: over the per-token rate limit; wait `Retry-After` seconds. */
            429: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description circuit_open (the agent's or tool's breaker is open) or unavailable (the database is down); `Retry-After` says when to retry. */
            503: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
        };
    };
    signal_callbacks_send: {
        parameters: {
            query?: never;
            header?: never;
            path: {
                /** @description the token of the wait's `callback_url` */
                token: string;
            };
            cookie?: never;
        };
        requestBody: {
            content: {
                "application/json": components["schemas"]["SignalSendInRequest"];
            };
        };
        responses: {
            200: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["SignalOut"];
                };
            };
            201: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["SignalOut"];
                };
            };
            /** @description validation_error: malformed JSON (nested deeper than 64 levels, duplicate keys, NUL, lone surrogates, numbers outside a double), wrong types, unknown fields, a reserved event type. `details` maps fields (`events[0].payload`, `body` for the JSON itself) to messages. */
            400: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description not_found: no such object in the caller's namespace (another namespace's task is 404 too), or no such route. */
            404: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description Conflict: `already_decided`, `task_closed`. */
            409: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description payload_too_large: the body is over the limit (default 256 KiB), declared or sent chunked. */
            413: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description unsupported_media_type: the body is not `application/json`. */
            415: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description rate_limited: over the per-token rate limit; wait `Retry-After` seconds. */
            429: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description circuit_open (the agent's or tool's breaker is open) or unavailable (the database is down); `Retry-After` says when to retry. */
            503: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
        };
    };
    tasks_list: {
        parameters: {
            query?: {
                /** @description the `next` link's cursor */
                cursor?: string;
                /** @description only tasks of this kind */
                kind?: string;
                /** @description 1-1000, default 100 */
                limit?: number;
                /** @description only tasks in this status */
                status?: "cancelled" | "compensated" | "compensating" | "completed" | "dead_lettered" | "failed" | "pending" | "running";
            };
            header?: never;
            path?: never;
            cookie?: never;
        };
        requestBody?: never;
        responses: {
            200: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["TaskListOut"];
                };
            };
            /** @description validation_error: malformed JSON (nested deeper than 64 levels, duplicate keys, NUL, lone surrogates, numbers outside a double), wrong types, unknown fields, a reserved event type. `details` maps fields (`events[0].payload`, `body` for the JSON itself) to messages. */
            400: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description not_authenticated: no token, or a token that is unknown or inactive. */
            401: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description payload_too_large: the body is over the limit (default 256 KiB), declared or sent chunked. */
            413: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description rate_limited: over the per-token rate limit; wait `Retry-After` seconds. */
            429: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description circuit_open (the agent's or tool's breaker is open) or unavailable (the database is down); `Retry-After` says when to retry. */
            503: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
        };
    };
    tasks_create: {
        parameters: {
            query?: never;
            header?: never;
            path?: never;
            cookie?: never;
        };
        requestBody: {
            content: {
                "application/json": components["schemas"]["TaskCreateInRequest"];
            };
        };
        responses: {
            200: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["TaskOut"];
                };
            };
            201: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["TaskOut"];
                };
            };
            /** @description validation_error: malformed JSON (nested deeper than 64 levels, duplicate keys, NUL, lone surrogates, numbers outside a double), wrong types, unknown fields, a reserved event type. `details` maps fields (`events[0].payload`, `body` for the JSON itself) to messages. */
            400: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description not_authenticated: no token, or a token that is unknown or inactive. */
            401: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description permission_denied: authenticated but not allowed (an agent reviewing dead letters, a staff session creating tasks). */
            403: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description Conflict: `task_exists`. */
            409: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description payload_too_large: the body is over the limit (default 256 KiB), declared or sent chunked. */
            413: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description unsupported_media_type: the body is not `application/json`. */
            415: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description rate_limited: over the per-token rate limit; wait `Retry-After` seconds. */
            429: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description circuit_open (the agent's or tool's breaker is open) or unavailable (the database is down); `Retry-After` says when to retry. */
            503: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
        };
    };
    tasks_retrieve: {
        parameters: {
            query?: never;
            header?: never;
            path: {
                /** @description the task's id (a UUID); another namespace's task is 404 */
                task_id: string;
            };
            cookie?: never;
        };
        requestBody?: never;
        responses: {
            200: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["TaskOut"];
                };
            };
            /** @description validation_error: malformed JSON (nested deeper than 64 levels, duplicate keys, NUL, lone surrogates, numbers outside a double), wrong types, unknown fields, a reserved event type. `details` maps fields (`events[0].payload`, `body` for the JSON itself) to messages. */
            400: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description not_authenticated: no token, or a token that is unknown or inactive. */
            401: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description not_found: no such object in the caller's namespace (another namespace's task is 404 too), or no such route. */
            404: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description payload_too_large: the body is over the limit (default 256 KiB), declared or sent chunked. */
            413: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description rate_limited: over the per-token rate limit; wait `Retry-After` seconds. */
            429: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description circuit_open (the agent's or tool's breaker is open) or unavailable (the database is down); `Retry-After` says when to retry. */
            503: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
        };
    };
    tasks_cancel: {
        parameters: {
            query?: never;
            header?: never;
            path: {
                /** @description the task's id */
                task_id: string;
            };
            cookie?: never;
        };
        requestBody: {
            content: {
                "application/json": components["schemas"]["TaskCancelInRequest"];
            };
        };
        responses: {
            200: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["TaskOut"];
                };
            };
            /** @description validation_error: malformed JSON (nested deeper than 64 levels, duplicate keys, NUL, lone surrogates, numbers outside a double), wrong types, unknown fields, a reserved event type. `details` maps fields (`events[0].payload`, `body` for the JSON itself) to messages. */
            400: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description not_authenticated: no token, or a token that is unknown or inactive. */
            401: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description not_found: no such object in the caller's namespace (another namespace's task is 404 too), or no such route. */
            404: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description Conflict: `task_closed`. */
            409: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description payload_too_large: the body is over the limit (default 256 KiB), declared or sent chunked. */
            413: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description unsupported_media_type: the body is not `application/json`. */
            415: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description rate_limited: over the per-token rate limit; wait `Retry-After` seconds. */
            429: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description circuit_open (the agent's or tool's breaker is open) or unavailable (the database is down); `Retry-After` says when to retry. */
            503: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
        };
    };
    tasks_diff: {
        parameters: {
            query?: never;
            header?: never;
            path: {
                /** @description the task compared with `task_id` (b; `task_id` is a) */
                other_id: string;
                /** @description the task's id (a UUID); another namespace's task is 404 */
                task_id: string;
            };
            cookie?: never;
        };
        requestBody?: never;
        responses: {
            200: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["TaskDiffOut"];
                };
            };
            /** @description validation_error: malformed JSON (nested deeper than 64 levels, duplicate keys, NUL, lone surrogates, numbers outside a double), wrong types, unknown fields, a reserved event type. `details` maps fields (`events[0].payload`, `body` for the JSON itself) to messages. */
            400: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description not_authenticated: no token, or a token that is unknown or inactive. */
            401: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description not_found: no such object in the caller's namespace (another namespace's task is 404 too), or no such route. */
            404: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description payload_too_large: the body is over the limit (default 256 KiB), declared or sent chunked. */
            413: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description rate_limited: over the per-token rate limit; wait `Retry-After` seconds. */
            429: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description circuit_open (the agent's or tool's breaker is open) or unavailable (the database is down); `Retry-After` says when to retry. */
            503: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
        };
    };
    tasks_events_list: {
        parameters: {
            query?: {
                /** @description only events after this seq; default 0 */
                after_seq?: number;
                /** @description 1-1000, default 100 */
                limit?: number;
            };
            header?: never;
            path: {
                /** @description the task's id (a UUID); another namespace's task is 404 */
                task_id: string;
            };
            cookie?: never;
        };
        requestBody?: never;
        responses: {
            200: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["EventListOut"];
                };
            };
            /** @description validation_error: malformed JSON (nested deeper than 64 levels, duplicate keys, NUL, lone surrogates, numbers outside a double), wrong types, unknown fields, a reserved event type. `details` maps fields (`events[0].payload`, `body` for the JSON itself) to messages. */
            400: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description not_authenticated: no token, or a token that is unknown or inactive. */
            401: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description not_found: no such object in the caller's namespace (another namespace's task is 404 too), or no such route. */
            404: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description payload_too_large: the body is over the limit (default 256 KiB), declared or sent chunked. */
            413: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description rate_limited: over the per-token rate limit; wait `Retry-After` seconds. */
            429: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description circuit_open (the agent's or tool's breaker is open) or unavailable (the database is down); `Retry-After` says when to retry. */
            503: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
        };
    };
    tasks_events_append: {
        parameters: {
            query?: never;
            header?: never;
            path: {
                /** @description the task's id (a UUID); another namespace's task is 404 */
                task_id: string;
            };
            cookie?: never;
        };
        requestBody: {
            content: {
                "application/json": components["schemas"]["EventAppendInRequest"];
            };
        };
        responses: {
            200: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["EventOut"];
                };
            };
            201: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["EventOut"];
                };
            };
            /** @description validation_error: malformed JSON (nested deeper than 64 levels, duplicate keys, NUL, lone surrogates, numbers outside a double), wrong types, unknown fields, a reserved event type. `details` maps fields (`events[0].payload`, `body` for the JSON itself) to messages. */
            400: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description not_authenticated: no token, or a token that is unknown or inactive. */
            401: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description permission_denied: authenticated but not allowed (an agent reviewing dead letters, a staff session creating tasks). */
            403: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description not_found: no such object in the caller's namespace (another namespace's task is 404 too), or no such route. */
            404: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description Conflict: `seq_conflict`, `stale_lease`, `task_closed`, `sandbox_refused`, `budget_exceeded`, `subject_erased`. */
            409: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description payload_too_large: the body is over the limit (default 256 KiB), declared or sent chunked. */
            413: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description unsupported_media_type: the body is not `application/json`. */
            415: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description idempotency_mismatch: a known idempotency key (or tool call step) reused with a different body. */
            422: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description rate_limited: over the per-token rate limit; wait `Retry-After` seconds. */
            429: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description circuit_open (the agent's or tool's breaker is open) or unavailable (the database is down); `Retry-After` says when to retry. */
            503: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
        };
    };
    tasks_events_batch_append: {
        parameters: {
            query?: never;
            header?: never;
            path: {
                /** @description the task's id (a UUID); another namespace's task is 404 */
                task_id: string;
            };
            cookie?: never;
        };
        requestBody: {
            content: {
                "application/json": components["schemas"]["EventBatchInRequest"];
            };
        };
        responses: {
            200: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["EventBatchOut"];
                };
            };
            201: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["EventBatchOut"];
                };
            };
            /** @description validation_error: malformed JSON (nested deeper than 64 levels, duplicate keys, NUL, lone surrogates, numbers outside a double), wrong types, unknown fields, a reserved event type. `details` maps fields (`events[0].payload`, `body` for the JSON itself) to messages. */
            400: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description not_authenticated: no token, or a token that is unknown or inactive. */
            401: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description permission_denied: authenticated but not allowed (an agent reviewing dead letters, a staff session creating tasks). */
            403: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description not_found: no such object in the caller's namespace (another namespace's task is 404 too), or no such route. */
            404: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description Conflict: `seq_conflict`, `stale_lease`, `task_closed`, `sandbox_refused`, `budget_exceeded`, `subject_erased`. */
            409: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description payload_too_large: the body is over the limit (default 256 KiB), declared or sent chunked. */
            413: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description unsupported_media_type: the body is not `application/json`. */
            415: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description idempotency_mismatch: a known idempotency key (or tool call step) reused with a different body. */
            422: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description rate_limited: over the per-token rate limit; wait `Retry-After` seconds. */
            429: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description circuit_open (the agent's or tool's breaker is open) or unavailable (the database is down); `Retry-After` says when to retry. */
            503: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
        };
    };
    tasks_fork: {
        parameters: {
            query?: never;
            header?: never;
            path: {
                /** @description the task's id (a UUID); another namespace's task is 404 */
                task_id: string;
            };
            cookie?: never;
        };
        requestBody: {
            content: {
                "application/json": components["schemas"]["TaskForkInRequest"];
            };
        };
        responses: {
            200: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["TaskOut"];
                };
            };
            201: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["TaskOut"];
                };
            };
            /** @description validation_error: malformed JSON (nested deeper than 64 levels, duplicate keys, NUL, lone surrogates, numbers outside a double), wrong types, unknown fields, a reserved event type. `details` maps fields (`events[0].payload`, `body` for the JSON itself) to messages. */
            400: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description not_authenticated: no token, or a token that is unknown or inactive. */
            401: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description not_found: no such object in the caller's namespace (another namespace's task is 404 too), or no such route. */
            404: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description Conflict: `task_exists`, `sandbox_refused`. */
            409: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description payload_too_large: the body is over the limit (default 256 KiB), declared or sent chunked. */
            413: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description unsupported_media_type: the body is not `application/json`. */
            415: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description rate_limited: over the per-token rate limit; wait `Retry-After` seconds. */
            429: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description circuit_open (the agent's or tool's breaker is open) or unavailable (the database is down); `Retry-After` says when to retry. */
            503: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
        };
    };
    tasks_heartbeat: {
        parameters: {
            query?: never;
            header?: never;
            path: {
                /** @description the task's id (a UUID); another namespace's task is 404 */
                task_id: string;
            };
            cookie?: never;
        };
        requestBody: {
            content: {
                "application/json": components["schemas"]["LeaseEpochInRequest"];
            };
        };
        responses: {
            200: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["HeartbeatOut"];
                };
            };
            /** @description validation_error: malformed JSON (nested deeper than 64 levels, duplicate keys, NUL, lone surrogates, numbers outside a double), wrong types, unknown fields, a reserved event type. `details` maps fields (`events[0].payload`, `body` for the JSON itself) to messages. */
            400: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description not_authenticated: no token, or a token that is unknown or inactive. */
            401: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description permission_denied: authenticated but not allowed (an agent reviewing dead letters, a staff session creating tasks). */
            403: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description not_found: no such object in the caller's namespace (another namespace's task is 404 too), or no such route. */
            404: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description Conflict: `stale_lease`. */
            409: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description payload_too_large: the body is over the limit (default 256 KiB), declared or sent chunked. */
            413: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description unsupported_media_type: the body is not `application/json`. */
            415: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description rate_limited: over the per-token rate limit; wait `Retry-After` seconds. */
            429: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description circuit_open (the agent's or tool's breaker is open) or unavailable (the database is down); `Retry-After` says when to retry. */
            503: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
        };
    };
    tasks_recovery_context: {
        parameters: {
            query?: never;
            header?: never;
            path: {
                /** @description the task's id (a UUID); another namespace's task is 404 */
                task_id: string;
            };
            cookie?: never;
        };
        requestBody?: never;
        responses: {
            /** @description recovery context */
            200: {
                headers: {
                    [name: string]: unknown;
                };
                content?: never;
            };
            /** @description validation_error: malformed JSON (nested deeper than 64 levels, duplicate keys, NUL, lone surrogates, numbers outside a double), wrong types, unknown fields, a reserved event type. `details` maps fields (`events[0].payload`, `body` for the JSON itself) to messages. */
            400: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description not_authenticated: no token, or a token that is unknown or inactive. */
            401: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description not_found: no such object in the caller's namespace (another namespace's task is 404 too), or no such route. */
            404: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description payload_too_large: the body is over the limit (default 256 KiB), declared or sent chunked. */
            413: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description rate_limited: over the per-token rate limit; wait `Retry-After` seconds. */
            429: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description circuit_open (the agent's or tool's breaker is open) or unavailable (the database is down); `Retry-After` says when to retry. */
            503: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
        };
    };
    tasks_release: {
        parameters: {
            query?: never;
            header?: never;
            path: {
                /** @description the task's id (a UUID); another namespace's task is 404 */
                task_id: string;
            };
            cookie?: never;
        };
        requestBody: {
            content: {
                "application/json": components["schemas"]["LeaseEpochInRequest"];
            };
        };
        responses: {
            200: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["TaskOut"];
                };
            };
            /** @description validation_error: malformed JSON (nested deeper than 64 levels, duplicate keys, NUL, lone surrogates, numbers outside a double), wrong types, unknown fields, a reserved event type. `details` maps fields (`events[0].payload`, `body` for the JSON itself) to messages. */
            400: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description not_authenticated: no token, or a token that is unknown or inactive. */
            401: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description permission_denied: authenticated but not allowed (an agent reviewing dead letters, a staff session creating tasks). */
            403: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description not_found: no such object in the caller's namespace (another namespace's task is 404 too), or no such route. */
            404: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description Conflict: `stale_lease`. */
            409: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description payload_too_large: the body is over the limit (default 256 KiB), declared or sent chunked. */
            413: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description unsupported_media_type: the body is not `application/json`. */
            415: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description rate_limited: over the per-token rate limit; wait `Retry-After` seconds. */
            429: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description circuit_open (the agent's or tool's breaker is open) or unavailable (the database is down); `Retry-After` says when to retry. */
            503: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
        };
    };
    tasks_signals_read: {
        parameters: {
            query?: {
                /** @description seconds to wait, 0 to 30; default 0 */
                wait?: number;
            };
            header?: never;
            path: {
                /** @description the signal's name: 1 to 100 letters, digits, - and _ */
                name: string;
                /** @description the task's id */
                task_id: string;
            };
            cookie?: never;
        };
        requestBody?: never;
        responses: {
            200: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["SignalOut"];
                };
            };
            /** @description validation_error: malformed JSON (nested deeper than 64 levels, duplicate keys, NUL, lone surrogates, numbers outside a double), wrong types, unknown fields, a reserved event type. `details` maps fields (`events[0].payload`, `body` for the JSON itself) to messages. */
            400: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description not_authenticated: no token, or a token that is unknown or inactive. */
            401: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description not_found: no such object in the caller's namespace (another namespace's task is 404 too), or no such route. */
            404: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description payload_too_large: the body is over the limit (default 256 KiB), declared or sent chunked. */
            413: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description rate_limited: over the per-token rate limit; wait `Retry-After` seconds. */
            429: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description circuit_open (the agent's or tool's breaker is open) or unavailable (the database is down); `Retry-After` says when to retry. */
            503: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
        };
    };
    tasks_signals_send: {
        parameters: {
            query?: never;
            header?: never;
            path: {
                /** @description the signal's name: 1 to 100 letters, digits, - and _ */
                name: string;
                /** @description the task's id */
                task_id: string;
            };
            cookie?: never;
        };
        requestBody: {
            content: {
                "application/json": components["schemas"]["SignalSendInRequest"];
            };
        };
        responses: {
            200: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["SignalOut"];
                };
            };
            201: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["SignalOut"];
                };
            };
            /** @description validation_error: malformed JSON (nested deeper than 64 levels, duplicate keys, NUL, lone surrogates, numbers outside a double), wrong types, unknown fields, a reserved event type. `details` maps fields (`events[0].payload`, `body` for the JSON itself) to messages. */
            400: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description not_authenticated: no token, or a token that is unknown or inactive. */
            401: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description permission_denied: authenticated but not allowed (an agent reviewing dead letters, a staff session creating tasks). */
            403: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description not_found: no such object in the caller's namespace (another namespace's task is 404 too), or no such route. */
            404: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description Conflict: `already_decided`, `task_closed`. */
            409: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description payload_too_large: the body is over the limit (default 256 KiB), declared or sent chunked. */
            413: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description unsupported_media_type: the body is not `application/json`. */
            415: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description rate_limited: over the per-token rate limit; wait `Retry-After` seconds. */
            429: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description circuit_open (the agent's or tool's breaker is open) or unavailable (the database is down); `Retry-After` says when to retry. */
            503: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
        };
    };
    tasks_signals_wait: {
        parameters: {
            query?: never;
            header?: never;
            path: {
                /** @description the signal's name: 1 to 100 letters, digits, - and _ */
                name: string;
                /** @description the task's id */
                task_id: string;
            };
            cookie?: never;
        };
        requestBody: {
            content: {
                "application/json": components["schemas"]["SignalWaitInRequest"];
            };
        };
        responses: {
            200: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["SignalWaitOut"];
                };
            };
            201: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["SignalWaitOut"];
                };
            };
            /** @description validation_error: malformed JSON (nested deeper than 64 levels, duplicate keys, NUL, lone surrogates, numbers outside a double), wrong types, unknown fields, a reserved event type. `details` maps fields (`events[0].payload`, `body` for the JSON itself) to messages. */
            400: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description not_authenticated: no token, or a token that is unknown or inactive. */
            401: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description permission_denied: authenticated but not allowed (an agent reviewing dead letters, a staff session creating tasks). */
            403: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description not_found: no such object in the caller's namespace (another namespace's task is 404 too), or no such route. */
            404: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description Conflict: `seq_conflict`, `stale_lease`, `task_closed`. */
            409: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description payload_too_large: the body is over the limit (default 256 KiB), declared or sent chunked. */
            413: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description unsupported_media_type: the body is not `application/json`. */
            415: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description rate_limited: over the per-token rate limit; wait `Retry-After` seconds. */
            429: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description circuit_open (the agent's or tool's breaker is open) or unavailable (the database is down); `Retry-After` says when to retry. */
            503: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
        };
    };
    tasks_subtasks_dispatch: {
        parameters: {
            query?: never;
            header?: never;
            path: {
                /** @description the task's id (a UUID); another namespace's task is 404 */
                task_id: string;
            };
            cookie?: never;
        };
        requestBody: {
            content: {
                "application/json": components["schemas"]["SubtaskInRequest"];
            };
        };
        responses: {
            200: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["SubtaskOut"];
                };
            };
            201: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["SubtaskOut"];
                };
            };
            /** @description validation_error: malformed JSON (nested deeper than 64 levels, duplicate keys, NUL, lone surrogates, numbers outside a double), wrong types, unknown fields, a reserved event type. `details` maps fields (`events[0].payload`, `body` for the JSON itself) to messages. */
            400: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description not_authenticated: no token, or a token that is unknown or inactive. */
            401: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description permission_denied: authenticated but not allowed (an agent reviewing dead letters, a staff session creating tasks). */
            403: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description not_found: no such object in the caller's namespace (another namespace's task is 404 too), or no such route. */
            404: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description Conflict: `seq_conflict`, `stale_lease`, `task_closed`, `sandbox_refused`, `budget_exceeded`, `subject_erased`. */
            409: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description payload_too_large: the body is over the limit (default 256 KiB), declared or sent chunked. */
            413: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description unsupported_media_type: the body is not `application/json`. */
            415: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description idempotency_mismatch: a known idempotency key (or tool call step) reused with a different body. */
            422: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description rate_limited: over the per-token rate limit; wait `Retry-After` seconds. */
            429: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description circuit_open (the agent's or tool's breaker is open) or unavailable (the database is down); `Retry-After` says when to retry. */
            503: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
        };
    };
    tasks_tool_calls_dispatch: {
        parameters: {
            query?: never;
            header?: never;
            path: {
                /** @description the task's id (a UUID); another namespace's task is 404 */
                task_id: string;
            };
            cookie?: never;
        };
        requestBody: {
            content: {
                "application/json": components["schemas"]["ToolCallDispatchInRequest"];
            };
        };
        responses: {
            200: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ToolCallDispatchOut"];
                };
            };
            201: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ToolCallDispatchOut"];
                };
            };
            202: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["AwaitingApprovalOut"];
                };
            };
            /** @description validation_error: malformed JSON (nested deeper than 64 levels, duplicate keys, NUL, lone surrogates, numbers outside a double), wrong types, unknown fields, a reserved event type. `details` maps fields (`events[0].payload`, `body` for the JSON itself) to messages. */
            400: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description not_authenticated: no token, or a token that is unknown or inactive. */
            401: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description permission_denied: authenticated but not allowed (an agent reviewing dead letters, a staff session creating tasks). */
            403: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description not_found: no such object in the caller's namespace (another namespace's task is 404 too), or no such route. */
            404: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description Conflict: `seq_conflict`, `stale_lease`, `task_closed`, `sandbox_refused`, `budget_exceeded`, `subject_erased`, `approval_denied`, `approval_expired`. */
            409: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description payload_too_large: the body is over the limit (default 256 KiB), declared or sent chunked. */
            413: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description unsupported_media_type: the body is not `application/json`. */
            415: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description idempotency_mismatch: a known idempotency key (or tool call step) reused with a different body. */
            422: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description rate_limited: over the per-token rate limit; wait `Retry-After` seconds. */
            429: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description circuit_open (the agent's or tool's breaker is open) or unavailable (the database is down); `Retry-After` says when to retry. */
            503: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
        };
    };
    tasks_verify: {
        parameters: {
            query?: never;
            header?: never;
            path: {
                /** @description the task's id (a UUID); another namespace's task is 404 */
                task_id: string;
            };
            cookie?: never;
        };
        requestBody?: never;
        responses: {
            200: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ChainVerifyOut"];
                };
            };
            /** @description validation_error: malformed JSON (nested deeper than 64 levels, duplicate keys, NUL, lone surrogates, numbers outside a double), wrong types, unknown fields, a reserved event type. `details` maps fields (`events[0].payload`, `body` for the JSON itself) to messages. */
            400: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description not_authenticated: no token, or a token that is unknown or inactive. */
            401: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description not_found: no such object in the caller's namespace (another namespace's task is 404 too), or no such route. */
            404: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description payload_too_large: the body is over the limit (default 256 KiB), declared or sent chunked. */
            413: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description rate_limited: over the per-token rate limit; wait `Retry-After` seconds. */
            429: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description circuit_open (the agent's or tool's breaker is open) or unavailable (the database is down); `Retry-After` says when to retry. */
            503: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
        };
    };
    tool_calls_retrieve: {
        parameters: {
            query?: never;
            header?: never;
            path: {
                /** @description the tool call's idempotency key, 64 lowercase hex digits */
                key: string;
            };
            cookie?: never;
        };
        requestBody?: never;
        responses: {
            200: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ToolCallOut"];
                };
            };
            /** @description validation_error: malformed JSON (nested deeper than 64 levels, duplicate keys, NUL, lone surrogates, numbers outside a double), wrong types, unknown fields, a reserved event type. `details` maps fields (`events[0].payload`, `body` for the JSON itself) to messages. */
            400: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description not_authenticated: no token, or a token that is unknown or inactive. */
            401: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description not_found: no such object in the caller's namespace (another namespace's task is 404 too), or no such route. */
            404: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description payload_too_large: the body is over the limit (default 256 KiB), declared or sent chunked. */
            413: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description rate_limited: over the per-token rate limit; wait `Retry-After` seconds. */
            429: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description circuit_open (the agent's or tool's breaker is open) or unavailable (the database is down); `Retry-After` says when to retry. */
            503: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
        };
    };
    tool_calls_result: {
        parameters: {
            query?: never;
            header?: never;
            path: {
                /** @description the tool call's idempotency key, 64 lowercase hex digits */
                key: string;
            };
            cookie?: never;
        };
        requestBody: {
            content: {
                "application/json": components["schemas"]["ToolCallResultInRequest"];
            };
        };
        responses: {
            200: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ToolCallOut"];
                };
            };
            201: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ToolCallOut"];
                };
            };
            /** @description validation_error: malformed JSON (nested deeper than 64 levels, duplicate keys, NUL, lone surrogates, numbers outside a double), wrong types, unknown fields, a reserved event type. `details` maps fields (`events[0].payload`, `body` for the JSON itself) to messages. */
            400: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description not_authenticated: no token, or a token that is unknown or inactive. */
            401: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description permission_denied: authenticated but not allowed (an agent reviewing dead letters, a staff session creating tasks). */
            403: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description not_found: no such object in the caller's namespace (another namespace's task is 404 too), or no such route. */
            404: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description Conflict: `seq_conflict`, `stale_lease`, `task_closed`. */
            409: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description payload_too_large: the body is over the limit (default 256 KiB), declared or sent chunked. */
            413: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description unsupported_media_type: the body is not `application/json`. */
            415: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description idempotency_mismatch: a known idempotency key (or tool call step) reused with a different body. */
            422: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description rate_limited: over the per-token rate limit; wait `Retry-After` seconds. */
            429: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description circuit_open (the agent's or tool's breaker is open) or unavailable (the database is down); `Retry-After` says when to retry. */
            503: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
        };
    };
    tool_policies_list: {
        parameters: {
            query?: never;
            header?: never;
            path?: never;
            cookie?: never;
        };
        requestBody?: never;
        responses: {
            200: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ToolPolicyListOut"];
                };
            };
            /** @description validation_error: malformed JSON (nested deeper than 64 levels, duplicate keys, NUL, lone surrogates, numbers outside a double), wrong types, unknown fields, a reserved event type. `details` maps fields (`events[0].payload`, `body` for the JSON itself) to messages. */
            400: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description not_authenticated: no token, or a token that is unknown or inactive. */
            401: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description permission_denied: authenticated but not allowed (an agent reviewing dead letters, a staff session creating tasks). */
            403: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description payload_too_large: the body is over the limit (default 256 KiB), declared or sent chunked. */
            413: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description rate_limited: over the per-token rate limit; wait `Retry-After` seconds. */
            429: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description circuit_open (the agent's or tool's breaker is open) or unavailable (the database is down); `Retry-After` says when to retry. */
            503: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
        };
    };
    tool_policies_set: {
        parameters: {
            query?: never;
            header?: never;
            path?: never;
            cookie?: never;
        };
        requestBody: {
            content: {
                "application/json": components["schemas"]["ToolPolicyInRequest"];
            };
        };
        responses: {
            201: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ToolPolicyOut"];
                };
            };
            /** @description validation_error: malformed JSON (nested deeper than 64 levels, duplicate keys, NUL, lone surrogates, numbers outside a double), wrong types, unknown fields, a reserved event type. `details` maps fields (`events[0].payload`, `body` for the JSON itself) to messages. */
            400: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description not_authenticated: no token, or a token that is unknown or inactive. */
            401: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description permission_denied: authenticated but not allowed (an agent reviewing dead letters, a staff session creating tasks). */
            403: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description payload_too_large: the body is over the limit (default 256 KiB), declared or sent chunked. */
            413: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description unsupported_media_type: the body is not `application/json`. */
            415: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description rate_limited: over the per-token rate limit; wait `Retry-After` seconds. */
            429: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description circuit_open (the agent's or tool's breaker is open) or unavailable (the database is down); `Retry-After` says when to retry. */
            503: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
        };
    };
    tool_policies_read: {
        parameters: {
            query?: never;
            header?: never;
            path: {
                /** @description the version's id */
                policy_id: number;
            };
            cookie?: never;
        };
        requestBody?: never;
        responses: {
            200: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ToolPolicyOut"];
                };
            };
            /** @description validation_error: malformed JSON (nested deeper than 64 levels, duplicate keys, NUL, lone surrogates, numbers outside a double), wrong types, unknown fields, a reserved event type. `details` maps fields (`events[0].payload`, `body` for the JSON itself) to messages. */
            400: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description not_authenticated: no token, or a token that is unknown or inactive. */
            401: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description permission_denied: authenticated but not allowed (an agent reviewing dead letters, a staff session creating tasks). */
            403: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description not_found: no such object in the caller's namespace (another namespace's task is 404 too), or no such route. */
            404: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description payload_too_large: the body is over the limit (default 256 KiB), declared or sent chunked. */
            413: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description rate_limited: over the per-token rate limit; wait `Retry-After` seconds. */
            429: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description circuit_open (the agent's or tool's breaker is open) or unavailable (the database is down); `Retry-After` says when to retry. */
            503: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
        };
    };
    tool_policies_versions_list: {
        parameters: {
            query?: never;
            header?: never;
            path: {
                /** @description any version's id */
                policy_id: number;
            };
            cookie?: never;
        };
        requestBody?: never;
        responses: {
            200: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ToolPolicyListOut"];
                };
            };
            /** @description validation_error: malformed JSON (nested deeper than 64 levels, duplicate keys, NUL, lone surrogates, numbers outside a double), wrong types, unknown fields, a reserved event type. `details` maps fields (`events[0].payload`, `body` for the JSON itself) to messages. */
            400: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description not_authenticated: no token, or a token that is unknown or inactive. */
            401: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description permission_denied: authenticated but not allowed (an agent reviewing dead letters, a staff session creating tasks). */
            403: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description not_found: no such object in the caller's namespace (another namespace's task is 404 too), or no such route. */
            404: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description payload_too_large: the body is over the limit (default 256 KiB), declared or sent chunked. */
            413: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description rate_limited: over the per-token rate limit; wait `Retry-After` seconds. */
            429: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description circuit_open (the agent's or tool's breaker is open) or unavailable (the database is down); `Retry-After` says when to retry. */
            503: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
        };
    };
    tools_invoke: {
        parameters: {
            query?: never;
            header?: never;
            path: {
                /** @description the registered tool's name */
                name: string;
            };
            cookie?: never;
        };
        requestBody: {
            content: {
                "application/json": components["schemas"]["ToolInvokeInRequest"];
            };
        };
        responses: {
            200: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ToolInvokeOut"];
                };
            };
            202: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["AwaitingApprovalOut"];
                };
            };
            /** @description validation_error: malformed JSON (nested deeper than 64 levels, duplicate keys, NUL, lone surrogates, numbers outside a double), wrong types, unknown fields, a reserved event type. `details` maps fields (`events[0].payload`, `body` for the JSON itself) to messages. */
            400: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description not_authenticated: no token, or a token that is unknown or inactive. */
            401: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description permission_denied: authenticated but not allowed (an agent reviewing dead letters, a staff session creating tasks). */
            403: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description not_found: no such object in the caller's namespace (another namespace's task is 404 too), or no such route. */
            404: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description Conflict: `seq_conflict`, `stale_lease`, `task_closed`, `sandbox_refused`, `budget_exceeded`, `subject_erased`, `approval_denied`, `approval_expired`. */
            409: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description payload_too_large: the body is over the limit (default 256 KiB), declared or sent chunked. */
            413: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description unsupported_media_type: the body is not `application/json`. */
            415: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description idempotency_mismatch: a known idempotency key (or tool call step) reused with a different body. */
            422: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description rate_limited: over the per-token rate limit; wait `Retry-After` seconds. */
            429: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description tool_unavailable: the tool gave no usable answer; the call stays in flight, retry with the same key. */
            502: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
            /** @description circuit_open (the agent's or tool's breaker is open) or unavailable (the database is down); `Retry-After` says when to retry. */
            503: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": components["schemas"]["ErrorOut"];
                };
            };
        };
    };
}
