"""What every builder adapter shares: entry-file checks (`checks`) and the image content hash (`digest`)."""
