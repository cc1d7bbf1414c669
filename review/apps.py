from django.apps import AppConfig


class ReviewConfig(AppConfig):
    name = "review"

    def ready(self) -> None:
        # Review builds on hosting's predictions: an endpoint's or a batch's low-confidence
        # predictions start human loops through hosting's signal (hosting imports no review).
        from hosting.flows import predictions_made
        from review.actions.loops import start_loops_for_hosted_predictions

        predictions_made.connect(start_loops_for_hosted_predictions, dispatch_uid="review.start_loops")
