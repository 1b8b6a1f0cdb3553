"""The chat content part types fd reads, as vLLM's chat parser reads them (its MM_PARSER_MAP), for the
server's messages and the offline `LLM.chat` alike.

Leaf module: no imports.
"""

# Parts whose `image_url` holds a picture: OpenAI's chat `image_url` ({"url": ...} or the URL string),
# and the Responses API's `input_image` (the URL string), which vLLM's chat reads too.
IMAGE_URL_PARTS = ("image_url", "input_image")
# Parts whose `text` is plain text: vLLM's chat reads the Responses API's input_text / output_text as text.
TEXT_PARTS = ("text", "input_text", "output_text")
