/** The part of ua-parser-js 1.x (CommonJS, no types of its own) that `user-agent-vars.ts` uses. */
declare module 'ua-parser-js' {
  export interface UAParserResult {
    ua: string;
    browser: { name?: string; version?: string; major?: string };
    engine: { name?: string; version?: string };
    os: { name?: string; version?: string };
    device: { vendor?: string; model?: string; type?: string };
    cpu: { architecture?: string };
  }
  export class UAParser {
    constructor(ua?: string);
    getResult(): UAParserResult;
  }
  export default UAParser;
}
