"""The Prometheus text exposition of ``GET /metrics`` (``cardfence.engine.serve._metrics``)."""

from __future__ import annotations

from cardfence.engine.serve._metrics import Family, render


def test_each_family_is_written_with_its_help_type_and_samples_in_order() -> None:
    text = render(
        [
            Family(
                "cardfence_deliveries_total",
                "Push deliveries answered.",
                "counter",
                [
                    ({"status": "200", "outcome": "applied"}, 3),
                    ({"status": "401", "outcome": "refused"}, 1),
                ],
            ),
            Family.single("cardfence_tasks_followed", "Live tasks followed.", "gauge", 7),
        ]
    )
    assert text == (
        "# HELP cardfence_deliveries_total Push deliveries answered.\n"
        "# TYPE cardfence_deliveries_total counter\n"
        'cardfence_deliveries_total{status="200",outcome="applied"} 3\n'
        'cardfence_deliveries_total{status="401",outcome="refused"} 1\n'
        "# HELP cardfence_tasks_followed Live tasks followed.\n"
        "# TYPE cardfence_tasks_followed gauge\n"
        "cardfence_tasks_followed 7\n"
    )


def test_label_values_and_help_are_escaped_so_no_line_can_be_forged() -> None:
    text = render(
        [
            Family(
                "m",
                "a help\nline with \\ in it",
                "gauge",
                [({"reason": 'say "hi"\n# TYPE m counter'}, 1)],
            )
        ]
    )
    assert text.splitlines() == [
        "# HELP m a help\\nline with \\\\ in it",
        "# TYPE m gauge",
        'm{reason="say \\"hi\\"\\n# TYPE m counter"} 1',
    ]


def test_whole_numbers_are_written_without_a_fraction_and_others_exactly() -> None:
    text = render([Family("m", "h", "gauge", [({"n": "a"}, 2.0), ({"n": "b"}, 0.25)])])
    assert text.splitlines()[2:] == ['m{n="a"} 2', 'm{n="b"} 0.25']


def test_a_help_line_keeps_its_double_quotes_only_label_values_escape_them() -> None:
    text = render([Family("m", 'the "help"', "counter", [({"k": 'v"'}, 2)])])
    assert text.splitlines() == ['# HELP m the "help"', "# TYPE m counter", 'm{k="v\\""} 2']
