"""The one home for pure scoring helpers shared by studies: parsing, the multiple-choice mapper, typed grades,
statistics and text metrics. The rule (README.md here): functions of text and numbers only."""
