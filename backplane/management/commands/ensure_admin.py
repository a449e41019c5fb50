from __future__ import annotations

import secrets
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser


class Command(BaseCommand):
    help = "Development only: create the 'admin' superuser on first start and print its login."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--username", default="admin")
        parser.add_argument("--url", default="http://127.0.0.1:8000/")

    def handle(self, *args: Any, **options: Any) -> None:
        if not settings.IS_LOCAL:
            raise CommandError("ensure_admin runs only with BACKPLANE_ENV=development or test")
        username = options["username"]
        # The password is kept under var/ (mode 0600) so every `make run` can print the login again.
        password_file = settings.VAR_DIR / "admin_password"
        User = get_user_model()
        user = User.objects.filter(username=username).first()
        if user is None:
            password = secrets.token_urlsafe(12)
            User.objects.create_superuser(username=username, email="", password=password)
            password_file.write_text(password + "\n")
            password_file.chmod(0o600)
        elif password_file.exists() and user.check_password(password_file.read_text().strip()):
            password = password_file.read_text().strip()
        else:
            self.stdout.write(
                f"Login: {options['url']}  user {username!r} (password changed; "
                f"reset with `manage.py changepassword {username}`)"
            )
            return
        banner = f"Login: {options['url']}  user: {username}  password: {password}"
        base = options["url"].rstrip("/")
        urls = f"API docs: {base}/api/docs/   Admin: {base}/admin/   Ready: {base}/readyz"
        rule = "=" * max(len(banner), len(urls))
        self.stdout.write("\n".join([rule, banner, urls, rule]))
