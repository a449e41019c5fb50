"""The people's roles as recovery's migrations 0013 and 0017 make them (docs/production.md, "Roles"), for
tests that log a staff user in. A transactional test's flush removes the migration's groups, so
each is made again here with the same permissions."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import Group, Permission, User

ROLES = {
    "Viewers": ("recovery.view_backplane",),
    "Operators": ("recovery.view_backplane", "recovery.operate_backplane"),
    "Reviewers": ("recovery.view_backplane", "backplane.review_deadletter"),
    "Approvers": ("recovery.view_backplane",),
    "Privacy officers": ("recovery.view_backplane", "backplane.open_personal_data", "backplane.erase_subject"),
}


def role_group(name: str) -> Group:
    """One of the roles, or another group (a tool policy may name any) holding nothing."""
    group, _ = Group.objects.get_or_create(name=name)
    for permission in ROLES.get(name, ()):
        app_label, _, codename = permission.partition(".")
        group.permissions.add(Permission.objects.get(content_type__app_label=app_label, codename=codename))
    return group


def staff_user(username: str, *roles: str, **fields: Any) -> User:
    """A staff user (not a superuser) in the given role groups."""
    user = User.objects.create_user(username, is_staff=True, **fields)
    user.groups.add(*(role_group(role) for role in roles))
    return user
