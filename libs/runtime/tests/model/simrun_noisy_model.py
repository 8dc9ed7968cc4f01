"""A model which prints while it is imported, as careless models do."""

from simrun_runtime import ExecContext, TaskSettings, UnsplitTaskType

print("noisy model imported")


class Noisy(UnsplitTaskType):
    """Prints and writes nothing."""

    class Settings(TaskSettings):
        level: int = 1

    def run(self, settings: Settings, context: ExecContext) -> None:
        print("running noisily")
