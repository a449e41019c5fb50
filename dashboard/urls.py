from django.contrib.auth import views as auth_views
from django.urls import include, path

from dashboard.views import fleet, fleet_ops, integrity
from dashboard.views import pages as views

app_name = "dashboard"

urlpatterns = [
    path("login/", auth_views.LoginView.as_view(redirect_authenticated_user=True), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("", views.overview, name="overview"),
    path("live/overview/", views.overview_live, name="overview-live"),
    path("tasks/", views.task_list, name="tasks"),
    path("tasks/<uuid:task_id>/", views.task_detail, name="task"),
    path("tasks/<uuid:task_id>/live/", views.task_live, name="task-live"),
    path("tasks/<uuid:task_id>/recovery-context/", views.task_recovery_context, name="task-recovery-context"),
    path("tasks/<uuid:task_id>/verify/", views.task_verify, name="task-verify"),
    path("tasks/", include("dashboard.views.forks")),
    path("dead-letters/", include("dashboard.views.dead_letters")),
    path("budgets/", include("dashboard.views.budgets")),
    path("approvals/", include("dashboard.views.approvals")),
    path("pauses/", include("dashboard.views.fleet_ops")),
    path("jobs/", include("dashboard.views.jobs")),
    path("privacy/", include("dashboard.views.privacy")),
    path("tasks/<uuid:task_id>/cancel/", fleet_ops.task_cancel_view, name="task-cancel"),
    path("searches/", include("dashboard.views.searches")),
    path("agents/", fleet.agents_page, name="agents"),
    path("agents/<int:agent_id>/reset-breaker/", fleet.agent_breaker_reset, name="agent-breaker-reset"),
    path("tools/<int:tool_id>/reset-breaker/", fleet.tool_breaker_reset_view, name="tool-breaker-reset"),
    path("outbox/", fleet.outbox_page, name="outbox"),
    path("integrity/", integrity.integrity_page, name="integrity"),
    path("integrity/verify-all/", integrity.verify_all, name="integrity-verify-all"),
    path("integrity/runs/<int:run_id>/", integrity.run_progress, name="integrity-run"),
    path("integrity/alerts/<int:alert_id>/acknowledge/", integrity.acknowledge_alert, name="integrity-acknowledge"),
    path("integrity/proof/", integrity.proof_download, name="integrity-proof"),
]
