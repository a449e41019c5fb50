from django.urls import path

from api import approvals, budgets, dead_letters, fleet, forks, integrity, jobs, tool_policies, views
from api import recovery as recovery_api

urlpatterns = [
    # The agent routes (api/routes.py; served to agents by the HTTP front, api/agent_front.py)
    # beside the routes DRF serves.
    path("tasks/", views.tasks_route, name="tasks"),
    path("tasks/<uuid:task_id>/", views.task_detail_route, name="task-detail"),
    path("tasks/<uuid:task_id>/events/", views.task_events_route, name="task-events"),
    path("tasks/<uuid:task_id>/events/batch/", views.task_events_batch_route, name="task-events-batch"),
    path("tasks/<uuid:task_id>/verify/", views.TaskVerifyView.as_view(), name="task-verify"),
    path("tasks/<uuid:task_id>/fork/", forks.task_fork_route, name="task-fork"),
    path("tasks/<uuid:task_id>/diff/<uuid:other_id>/", forks.TaskDiffView.as_view(), name="task-diff"),
    path("tasks/<uuid:task_id>/cancel/", fleet.TaskCancelView.as_view(), name="task-cancel"),
    path("pauses/", fleet.PausesView.as_view(), name="pauses"),
    path("pauses/<int:pause_id>/resume/", fleet.PauseResumeView.as_view(), name="pause-resume"),
    path("leases/", recovery_api.leases_route, name="leases"),
    path("tasks/<uuid:task_id>/heartbeat/", recovery_api.heartbeat_route, name="task-heartbeat"),
    path("tasks/<uuid:task_id>/release/", recovery_api.release_route, name="task-release"),
    path(
        "tasks/<uuid:task_id>/recovery-context/",
        recovery_api.recovery_context_route,
        name="task-recovery-context",
    ),
    path("tasks/<uuid:task_id>/tool-calls/", recovery_api.tool_calls_route, name="task-tool-calls"),
    path("tool-calls/<str:key>/", recovery_api.tool_call_detail_route, name="tool-call-detail"),
    path("tool-calls/<str:key>/result/", recovery_api.tool_call_result_route, name="tool-call-result"),
    path("tasks/<uuid:task_id>/subtasks/", recovery_api.subtasks_route, name="task-subtasks"),
    path("tools/<slug:name>/invoke/", recovery_api.tool_invoke_route, name="tool-invoke"),
    path("seals/latest/", integrity.SealLatestView.as_view(), name="seal-latest"),
    path("seals/consistency/", integrity.SealConsistencyView.as_view(), name="seal-consistency"),
    path("events/<int:position>/proof/", integrity.EventProofView.as_view(), name="event-proof"),
    path("budgets/", budgets.BudgetsView.as_view(), name="budgets"),
    path("budgets/<int:budget_id>/resume/", budgets.BudgetResumeView.as_view(), name="budget-resume"),
    path("approvals/", approvals.ApprovalsView.as_view(), name="approvals"),
    path("approvals/<uuid:approval_id>/", approvals.approval_detail_route, name="approval-detail"),
    path("approvals/<uuid:approval_id>/approve/", approvals.ApprovalApproveView.as_view(), name="approval-approve"),
    path("approvals/<uuid:approval_id>/deny/", approvals.ApprovalDenyView.as_view(), name="approval-deny"),
    path("tool-policies/", tool_policies.ToolPoliciesView.as_view(), name="tool-policies"),
    path("tool-policies/<int:policy_id>/", tool_policies.ToolPolicyView.as_view(), name="tool-policy"),
    path("tool-policies/<int:policy_id>/versions/", tool_policies.ToolPolicyVersionsView.as_view(),
         name="tool-policy-versions"),
    path("jobs/", jobs.JobsView.as_view(), name="jobs"),
    path("jobs/<int:job_id>/", jobs.JobDetailView.as_view(), name="job-detail"),
    path("jobs/<int:job_id>/items/", jobs.JobItemsView.as_view(), name="job-items"),
    path("jobs/<int:job_id>/start/", jobs.JobStartView.as_view(), name="job-start"),
    path("jobs/<int:job_id>/pause/", jobs.JobPauseView.as_view(), name="job-pause"),
    path("jobs/<int:job_id>/resume/", jobs.JobResumeView.as_view(), name="job-resume"),
    path("jobs/<int:job_id>/abort/", jobs.JobAbortView.as_view(), name="job-abort"),
    path("jobs/<int:job_id>/retry-failed/", jobs.JobRetryFailedView.as_view(), name="job-retry-failed"),
    path("dead-letters/", dead_letters.DeadLettersView.as_view(), name="dead-letters"),
    path(
        "dead-letters/<int:dead_letter_id>/requeue/",
        dead_letters.DeadLetterRequeueView.as_view(),
        name="dead-letter-requeue",
    ),
    path(
        "dead-letters/<int:dead_letter_id>/discard/",
        dead_letters.DeadLetterDiscardView.as_view(),
        name="dead-letter-discard",
    ),
]
