// GPT-2's reference encoder (the npm package gpt-3-encoder, an independent JavaScript port of
// OpenAI's encoder.py) over a list of texts.
//   node gpt2_reference.js PACKAGE_DIR IN.json OUT.json
// IN.json is a JSON array of strings; OUT.json gets one array of ids per string.
const fs = require('fs');
const [packageDir, inFile, outFile] = process.argv.slice(2);
const { encode } = require(packageDir);
const texts = JSON.parse(fs.readFileSync(inFile, 'utf-8'));
fs.writeFileSync(outFile, JSON.stringify(texts.map((t) => encode(t))));
