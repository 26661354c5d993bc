-- An input may set the answering template's variables (`variables`, docs/prompt.md, "Macros"):
-- a JSON object of name -> string, validated against the template at admission and rendered at
-- materialization in place of the declared defaults. Null when the input sets none.
ALTER TABLE inputs ADD COLUMN variables TEXT;
