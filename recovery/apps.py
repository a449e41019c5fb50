from django.apps import AppConfig


class RecoveryConfig(AppConfig):
    name = "recovery"
    verbose_name = "Recovery: leases, stalls, tool gateway"

    def ready(self) -> None:
        # Recovery builds on the event log, never the other way round: the log offers the
        # follow-up hook and recovery plugs its breakers, sagas and parent reports into it.
        from backplane.eventlog.writer import FollowUp, register_follow_up, register_observer
        from backplane.metrics import register_collector
        from recovery import budgets, handlers
        from recovery.metrics import RecoveryCollector, count_committed_events

        for follow_up in handlers.FOLLOW_UPS:
            register_follow_up(follow_up)
        register_collector(RecoveryCollector())
        # Only observes (it counts after commit): every event is counted.
        register_observer(count_committed_events)
        register_follow_up(FollowUp(concerns=budgets.spends, run=budgets.budget_note_spending,
                                    idle_async=budgets.budgets_idle_async))
