"""The command line's error helper, for the adapters above `bert_model` (service, load tests): defined in
`bert_model.cli_errors`, which the model's and export's commands import directly."""

from bert_model.cli_errors import USER_ERRORS, exit_on_user_error

__all__ = ["USER_ERRORS", "exit_on_user_error"]
