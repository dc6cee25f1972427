"""Errors meant for the user: one clear line, a non-zero exit, no traceback."""


class UserError(Exception):
    exit_code = 1

    def __init__(self, message: str, exit_code: int = 1):
        super().__init__(message)
        self.exit_code = exit_code
