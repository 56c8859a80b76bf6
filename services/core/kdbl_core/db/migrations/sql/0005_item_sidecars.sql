-- Subtitle sidecars: the listing pairs an audio/video file with a subtitle file next to it
-- (talk.mp4 + talk.vtt / talk.en.srt), and the item carries that key to whichever worker extracts it,
-- so the pairing works the same for every connector (it needs nothing but the listing).

ALTER TABLE crawl_items ADD COLUMN sidecar_key text;
